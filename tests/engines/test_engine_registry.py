"""A new engine is its package plus one registry entry (rnb.engines.registry), and nothing else asks for an engine
by name: a stand-in engine (tests/support/standin_engine) registered here is checked, launched and run like the others."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rnb import cli, launch
from rnb.engines import registry
from rnb.engines.registry import ENGINES, Engine
from rnb.pipeline.config import ConfigError, load_config
from tests.support.standin_engine import driver as standin_driver

REPO = Path(__file__).resolve().parents[2]
STANDIN = Engine("standin", "the tests' stand-in, over the local engine's processes", "tests.support.standin_engine.driver:run",
                 forks_here=True, gpus_checked_here=True, spans_hosts=False)
# Where an engine's name may be compared: the registry, and an engine's own package.
MAY_NAME_ENGINES = ("rnb/engines/registry.py", "rnb/engines/ray/", "rnb/engines/local/")


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setitem(ENGINES, STANDIN.name, STANDIN)
    return STANDIN


def _config_on(engine: str, tmp_path: Path) -> Path:
    document = json.loads((REPO / "config/toy.json").read_text())
    path = tmp_path / "toy-standin.json"
    path.write_text(json.dumps({**document, "run": {**document.get("run", {}), "engine": engine}}))
    return path


def test_a_config_names_a_registered_engine_and_no_other(standin, tmp_path):
    assert load_config(str(_config_on("standin", tmp_path))).run["engine"] == "standin"
    with pytest.raises(ConfigError) as refused:
        load_config(str(_config_on("elsewhere", tmp_path)))
    assert refused.value.expected == 'expected one of "local", "ray", "standin", found the string "elsewhere"'


def test_the_command_line_and_the_launcher_read_the_entry(standin):
    assert cli.parse_args(["--engine", "standin"]).engine == "standin"
    shown = " ".join(cli.benchmark_parser().format_help().split())
    assert "--engine ENGINE the engine that runs the job, one of local, ray, standin" in shown
    assert launch.starts_local_children(["--engine", "standin"])
    assert not launch.starts_local_children(["--engine", "standin", "--engine=ray"])   # the last one wins
    assert registry.spans_hosts("ray") and not registry.spans_hosts("standin")


def _names_engines(node: ast.AST) -> bool:
    """A comparison with an engine's name, or a literal list of two or more of them (a flag's choices)."""
    def named(leaf: ast.expr) -> bool:
        return isinstance(leaf, ast.Constant) and leaf.value in ENGINES
    if isinstance(node, ast.Compare):
        return any(named(operand) for operand in (node.left, *node.comparators))
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return sum(named(element) for element in node.elts) >= 2
    return False


def test_no_module_outside_the_registry_and_an_engines_package_compares_an_engine_name():
    found = [f"{path.relative_to(REPO)}:{node.lineno}" for path in sorted(REPO.glob("rnb/**/*.py"))
             if not str(path.relative_to(REPO)).startswith(MAY_NAME_ENGINES)
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if _names_engines(node)]
    assert found == []
    # What it looks for, as main had it before the registry (rnb/cli.py, rnb/tune/cli.py):
    assert _names_engines(ast.parse('args.engine == "ray"', mode="eval").body)
    assert _names_engines(ast.parse('("local", "ray")', mode="eval").body)


@pytest.mark.slow
def test_the_stand_in_engine_runs_the_toy_config_end_to_end_into_a_log_the_analysis_reads(standin, tmp_path, capsys,
                                                                                         job_log):
    code = cli.main(["-c", "config/toy.json", "--engine", "standin", "-v", "30", "-mi", "0", "-q",
                     "--log-dir", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    assert standin_driver.CALLED[-1] == "config/toy.json"
    job = job_log(tmp_path)
    assert job.meta["engine"] == {"name": "standin"}
    assert (job.meta["termination_reason"], job.meta["finished_items"]) == ("target reached", 30)
    assert len({row["item_id"] for row in job.rows}) == len(job.rows) == 30
    assert job.children_left == []
    analysed = subprocess.run([sys.executable, "scripts/analyze.py", str(job.dir)], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
    assert analysed.returncode == 0, analysed.stderr
    assert analysed.stdout.splitlines()[2].split()[0] == job.dir.name
