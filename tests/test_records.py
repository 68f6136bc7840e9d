from torchdebug.records import NO_MODULE, Record, call_name, make_call_name, make_name, module_of, split_call_name


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


def test_module_of_names_the_module_of_a_slot_or_a_call():
    assert module_of("forward/layers.1.mlp/module#0/output.0") == "layers.1.mlp"
    assert module_of(make_call_name("forward", "", "monitor.loss", 0)) == NO_MODULE


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


_BEFORE_ZEROS = (
    '{"name":"forward/-/aten.relu.default#0/output.0","step":0,"rank":0,"phase":"forward","module":"-",'
    '"op":"aten.relu.default","call":0,"seq":0,"io":"output","arg":"0","kind":"tensor","dtype":"float32",'
    '"stats":{"min":0.0,"max":2.0,"mean":0.5,"norm":3.0,"nan":0,"posinf":0,"neginf":0},"capture":"eager"}'
)
"""A record line of a dump written before the ``zeros`` statistic existed."""


def test_a_record_written_before_zeros_existed_reads_it_as_unknown_and_writes_back_unchanged():
    import json

    from torchdebug.cli.show import format_record
    from torchdebug.store._record_json import encode_record, encode_records

    record = Record.from_json(json.loads(_BEFORE_ZEROS))
    assert record.stats.get("zeros") is None and record.stats["nan"] == 0
    assert encode_record(record) == _BEFORE_ZEROS and encode_records([record]) == _BEFORE_ZEROS + "\n"
    assert "nan 0 +inf 0 -inf 0 zeros -" in format_record(record, None, with_stack=False)


def test_zeros_are_written_read_back_and_shown():
    import json

    from torchdebug.cli.show import format_record
    from torchdebug.store._record_json import encode_records

    stats = {"min": 0.0, "max": 2.0, "mean": 0.5, "norm": 3.0, "nan": 0, "posinf": 0, "neginf": 0, "zeros": 12}
    line = encode_records([_record(stats=stats)])
    assert line.endswith('"neginf":0,"zeros":12},"capture":"eager"}\n')
    assert Record.from_json(json.loads(line)).stats == stats
    assert "-inf 0 zeros 12" in format_record(_record(stats=stats), None, with_stack=False)


def test_a_call_name_and_its_slot_make_the_slot_name_and_cut_back_into_them():
    for module, arg in (("layers.0.attn", "0"), ("", "1"), ("m", "")):
        name = make_name("backward", module, "aten.mm.default", 3, "input", arg)
        call = make_call_name("backward", module, "aten.mm.default", 3)
        slot = f"input.{arg}" if arg else "input"
        assert name == f"{call}/{slot}"
        assert split_call_name(name) == (call, slot)
    assert make_call_name("forward", "", "module", 0) == f"forward/{NO_MODULE}/module#0"


def test_value_ids_round_trip_through_arrow_and_json_lines_and_are_none_where_a_dump_has_none():
    import json

    from torchdebug.store._record_columns import records_from_table, records_table
    from torchdebug.store._record_json import encode_record

    view = _record(dtype="float32", shape=[2], value_id=4097, version=3, view_of=4000)
    plain = _record(name="forward/fc1/aten.addmm.default#0/output.1", arg="1", value_id=5, version=0)
    scalar = _record(name="forward/fc1/aten.addmm.default#0/input.3", io="input", arg="3", kind="value", value=1.0)
    table = records_table([view, plain, scalar])
    assert records_from_table(table) == [view, plain, scalar]
    assert Record.from_json(json.loads(encode_record(view))) == view
    older = table.drop_columns(["value_id", "version", "view_of"])  # a dump written before value ids
    assert [(r.value_id, r.version, r.view_of) for r in records_from_table(older)] == [(None, None, None)] * 3
