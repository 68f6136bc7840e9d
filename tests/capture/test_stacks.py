"""Call stacks of captured ops: the user frames, outermost first, each with its line."""

from torchdebug.capture.stacks import StackRecorder


def _two_lines(recorder: StackRecorder) -> tuple:
    first = recorder.capture()
    second = recorder.capture()
    return first, second


def _caller(recorder: StackRecorder) -> tuple:
    return _two_lines(recorder)


def _one_line(recorder: StackRecorder) -> tuple:
    return recorder.capture()


def test_a_stack_whose_innermost_frame_moved_to_another_line_keeps_its_callers_and_takes_the_new_line():
    recorder = StackRecorder()
    (first_id, first_frames, first_source), (second_id, second_frames, second_source) = _caller(recorder)
    assert second_frames[:-1] == first_frames[:-1]
    assert "_caller" in second_frames[-2] and "_two_lines" in second_frames[-1]
    first_line, second_line = (int(source.rsplit(":", 1)[1].split()[0]) for source in (first_source, second_source))
    assert second_line == first_line + 1
    assert f"line {second_line}," in second_frames[-1] and "second = recorder.capture()" in second_frames[-1]
    assert second_id != first_id


def test_a_stack_taken_again_from_a_new_frame_is_walked_anew():
    recorder = StackRecorder()
    _, first_frames, _ = _caller(recorder)[0]
    _, frames, source = _one_line(recorder)
    assert "_one_line" in frames[-1] and "_one_line" in source
    assert not any(", in _two_lines" in frame or ", in _caller" in frame for frame in frames)
    assert frames[:-2] == first_frames[:-3]  # the test function's callers
    assert "test_a_stack_taken_again" in frames[-2] and "_one_line(recorder)" in frames[-2]
