"""meta.json's records: what an engine writes reads back equal, and a field of the wrong type is named."""
from __future__ import annotations

import dataclasses

import pytest

from rnb.core.records import JobLogError, ProcessRecord


def every_field_set() -> ProcessRecord:
    """A record with no field left at its default, so that a field the reader forgets cannot read back equal."""
    values: dict[str, object] = {}
    for number, f in enumerate(dataclasses.fields(ProcessRecord)):
        kind = str(f.type)
        if f.name == "role":
            values[f.name] = "runner"
        elif f.name == "status":
            values[f.name] = "killed"
        elif f.name == "gpu_ids":
            values[f.name] = ("GPU-1", "GPU-2")
        elif kind.startswith("int"):
            values[f.name] = 1000 + number
        else:
            values[f.name] = f"value of {f.name}"
    return ProcessRecord(**values)  # type: ignore[arg-type]


def test_a_process_record_with_every_field_set_reads_back_equal():
    record = every_field_set()
    assert all(getattr(record, f.name) != f.default for f in dataclasses.fields(ProcessRecord))
    assert ProcessRecord.from_json(record.to_json(), "meta.json: processes[0]") == record


@pytest.mark.parametrize(("key", "value", "message"), [
    ("pid", "1234", "meta.json: processes[0]: needs an integer 'pid', found '1234'."),
    ("exitcode", True, "meta.json: processes[0]: needs an integer 'exitcode', found True."),
    ("device", 0, "meta.json: processes[0]: needs a string 'device', found 0."),
    ("status", "crashed", "meta.json: processes[0]: 'status' should be one of 'ok', 'failed', 'killed', "
                          "'not started', found 'crashed'."),
])
def test_a_process_field_of_the_wrong_type_is_one_sentence_naming_it(key, value, message):
    document = every_field_set().to_json()
    document[key] = value
    with pytest.raises(JobLogError) as error:
        ProcessRecord.from_json(document, "meta.json: processes[0]")
    assert str(error.value) == message


def test_a_hand_written_record_with_only_a_name_and_role_reads_with_defaults():
    assert ProcessRecord.from_json({"name": "client", "role": "client"}, "meta.json") == ProcessRecord("client", "client")
