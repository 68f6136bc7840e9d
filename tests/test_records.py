from torchdebug.records import Record, call_name, make_name


def _record(**overrides):
    fields = dict(
        name="forward/fc1/aten.addmm.default#0/output.0",
        step=0,
        rank=0,
        phase="forward",
        module="fc1",
        op="aten.addmm.default",
        call=0,
        seq=3,
        io="output",
        arg="0",
    )
    return Record(**{**fields, **overrides})


def test_make_name_joins_phase_module_op_call_and_slot():
    assert make_name("backward", "layers.0", "aten.mm.default", 2, "input", "1") == "backward/layers.0/aten.mm.default#2/input.1"


def test_make_name_marks_ops_outside_modules_with_a_dash():
    assert make_name("forward", "", "aten.sum.default", 0, "output", "0") == "forward/-/aten.sum.default#0/output.0"


def test_call_name_drops_the_slot_part():
    assert call_name("forward/fc1/aten.addmm.default#0/input.2") == "forward/fc1/aten.addmm.default#0"


def test_record_round_trips_through_json_without_empty_fields():
    record = _record(dtype="float32", shape=[2, 3], stats={"min": 0.0})
    data = record.to_json()
    assert "tensor" not in data and "extra" not in data
    assert Record.from_json(data) == record


def test_record_from_json_keeps_unknown_keys_in_extra():
    data = {**_record().to_json(), "future_field": 7}
    assert Record.from_json(data).extra == {"future_field": 7}


def test_records_of_torchdebug_0_1_dumps_read_their_error_field_as_capture_error():
    record = Record.from_json({**_record().to_json(), "error": "layout torch.sparse_coo is not captured"})
    assert record.capture_error == "layout torch.sparse_coo is not captured" and record.extra == {}
