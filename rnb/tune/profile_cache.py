"""The profile cache (DIR/profiles/), and the profiling jobs run for what it lacks."""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from rnb.analysis.job_dirs import read_job
from rnb.analysis.jobs import JobLogError
from rnb.analysis.sweep import RunOutcome, SweepError
from rnb.tune.cores import with_others
from rnb.tune.profile import Profile, ProfileError, ProfileJob, ProfileKey
from rnb.tune.profile_read import read_profile

# How profiles are read off their jobs; a cached profile read another way is measured again. 2: the first
# call kept after the trimmed start no longer counts its wait behind the trimmed calls as service. 3: the CPU
# that the runner, the harness's hops, the client and main spent, and the host's cores in the key. 4: the CPU
# of Ray's daemons per item and hop. 5: the latency of the hop from the measured step to the sink.
PROFILE_VERSION = 5


class ProfileCache:
    """DIR/profiles/: one JSON file per profile key, written whole or not at all."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, key: ProfileKey) -> Path:
        return self.root / f"{key.digest}.json"

    def get(self, key: ProfileKey) -> Profile | None:
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
            if data.get("version") != PROFILE_VERSION:
                return None
            profile = Profile.from_json(data)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None   # a file from another version, or damaged: measure again
        return profile if profile.key == key else None

    def put(self, profile: Profile) -> None:
        write_json_atomic(self.path(profile.key), {"version": PROFILE_VERSION, **profile.to_json()})


def write_json_atomic(path: Path, document: object) -> None:
    """Write a JSON file so that a reader (or a Ctrl-C) sees it whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")
    os.replace(partial, path)


Runner = Callable[[Path, int], RunOutcome]   # (config file, -v) -> the job it left


def profile_all(jobs: Sequence[ProfileJob], cache: ProfileCache, run: Runner,
                progress: Callable[[ProfileJob, bool], None] = lambda job, cached: None) -> dict[ProfileKey, Profile]:
    """Every job's profiles, from the cache where they are, else measured (and cached at once).

    A job whose profile is cached is not run; a Batcher measured with the
    group it feeds is cached under its own key in the same pass.
    """
    profiles: dict[ProfileKey, Profile] = {}
    for job in jobs:
        keys = (job.key,) if job.batcher_key is None else (job.key, job.batcher_key)
        cached = {key: cache.get(key) for key in keys}
        if all(profile is not None for profile in cached.values()):
            profiles.update({key: profile for key, profile in cached.items() if profile is not None})
            progress(job, True)
            continue
        config_path = cache.root / "configs" / f"{job.key.digest}.json"
        write_json_atomic(config_path, job.document)
        try:
            outcome, others = with_others(lambda: run(config_path, job.videos))
        except SweepError as error:
            raise ProfileError(f"profiling {job.what} ({job.key.model}) failed: {error}") from None
        try:
            measured = read_job(outcome.job_dir)
            profile = read_profile(measured, job.key, job.position, job.form.cards, others)
            batcher = (None if job.batcher_key is None
                       else read_profile(measured, job.batcher_key, job.position - 1, None, others))
        except (ProfileError, JobLogError) as error:
            raise ProfileError(f"profiling {job.what} ({job.key.model}) failed: {error}") from None
        for one in (profile, batcher):
            if one is not None:
                cache.put(one)
                profiles[one.key] = one
        progress(job, False)
    return profiles
