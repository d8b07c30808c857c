"""Request sources: what the client sends, built from the config's "source" object.

A source is any iterable of request payloads.  Which kind a config means is
decided by the first key of its "source" object; `SOURCE_FACTORIES` maps that
key to the dotted path of a factory, so a new kind (e.g. a dataset) is one
entry here and the client never changes.  Factories are imported lazily,
inside the client process, so a kind's heavy imports cost nothing elsewhere.
"""
from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterable, Iterator, Mapping

from rnb.core.records import Json
from rnb.pipeline.config_records import ConfigError
from rnb.pipeline.dotted import load_object

# first key of config.source -> dotted path of `factory(source, config_path) -> Iterable`
SOURCE_FACTORIES: dict[str, str] = {
    "synthetic": "rnb.pipeline.sources.synthetic_source",
    "video_path_iterator": "rnb.pipeline.sources.path_iterator_source",
    "dataset": "rnb.pipeline.dataset_source.episode_source",
    "videos": "rnb.pipeline.dataset_source.episode_source",
}
# first key -> dotted path of `check(source, config_path, may_write) -> None`, run by the main process before
# anything starts, so that a source which cannot work is a config error (exit 2) rather than a failed client;
# `may_write` False (--check) forbids it to create anything, such as a dataset it would generate
SOURCE_CHECKS: dict[str, str] = {
    "synthetic": "rnb.pipeline.sources.check_synthetic",
    "dataset": "rnb.pipeline.dataset_source.check_source",
    "videos": "rnb.pipeline.dataset_source.check_source",
}


def source_factory_path(source: Mapping[str, Json], config_path: str) -> str:
    """The factory a source object names; raises ConfigError for an unknown kind."""
    kind = next(iter(source), "synthetic")
    if kind not in SOURCE_FACTORIES:
        raise ConfigError(config_path, f"source.{kind}",
                          f"expected a source whose first key is one of {', '.join(sorted(SOURCE_FACTORIES))}")
    return SOURCE_FACTORIES[kind]


def check_source(source: Mapping[str, Json], config_path: str, may_write: bool = True) -> object:
    """Raise ConfigError if the source cannot work; kinds without a check only need a known kind.

    Returns the dataset the check opened (for models to vet their keywords against), or None.
    """
    source_factory_path(source, config_path)
    check = SOURCE_CHECKS.get(next(iter(source), "synthetic"))
    return None if check is None else load_object(check)(source, config_path, may_write)


def open_source(source: Mapping[str, Json], config_path: str, seed: int = 0) -> Iterator[object]:
    """An iterator over the request payloads of a config's source (passed on to step 0's model as they are).

    `seed` (the job's --seed) reaches factories that take a `seed` keyword, for sources with a random order.
    """
    factory = load_object(source_factory_path(source, config_path))
    if "seed" in inspect.signature(factory).parameters:
        return iter(factory(source, config_path, seed=seed))
    return iter(factory(source, config_path))


def check_synthetic(source: Mapping[str, Json], config_path: str, may_write: bool = True) -> None:
    """The synthetic source takes no options: any other key is a typo or meant for another kind."""
    if source.get("synthetic", True) is not True:
        raise ConfigError(config_path, "source.synthetic", "expected true (or no source at all)")
    for key in source:
        if key != "synthetic":
            raise ConfigError(config_path, f"source.{key}", "expected no other key beside \"synthetic\", which takes "
                              "no options, found an unknown key")


def synthetic_source(source: Mapping[str, Json], config_path: str) -> Iterable[int]:
    """Numbered requests 0, 1, 2, ...: for models that make their own input."""
    check_synthetic(source, config_path)
    return itertools.count()


def path_iterator_source(source: Mapping[str, Json], config_path: str) -> Iterable[object]:
    """RnB's form: an instance of the named class, built with the source's other keys."""
    options = {key: value for key, value in source.items() if key != "video_path_iterator"}
    return load_object(str(source["video_path_iterator"]))(**options)
