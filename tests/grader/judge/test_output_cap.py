"""The output cap keeps the same outputs whatever the pieces a kernel sent them in.

ipykernel sends a cell's stdout in pieces whose sizes depend on how fast the kernel ran (it
batches writes by time), so a flooding cell's stdout arrives as one huge message on an idle
host and as many small ones on a busy one. :meth:`LimitedExecute.output` must keep the same
text either way: the first ``output_limit`` characters, as one output per stream, with the
kernel interrupted once. No kernel here: the executor's own handler is fed the iopub messages
a kernel would send (the interrupt goes to a recorder standing in for the kernel manager).
"""

import asyncio

from nbformat import NotebookNode

from autograder.judge.execute import LimitedExecute

LIMIT = 1_000
LINE = "x" * 99 + "\n"  # a flooding cell's print


def message(msg_type, content):
    return {"msg_type": msg_type, "header": {"msg_type": msg_type},
            "parent_header": {"msg_id": "cell"}, "content": content}


def stream(text, name="stdout"):
    return message("stream", {"name": name, "text": text})


class Interrupts:
    """The kernel manager's ``interrupt_kernel``, counted."""

    def __init__(self):
        self.count = 0

    async def interrupt_kernel(self):
        self.count += 1


def capped(messages, reply=None):
    """The outputs :class:`LimitedExecute` keeps of ``messages`` (one cell), then of the
    execute ``reply``'s content (nbgrader's ``on_cell_executed`` hook, as nbclient calls it
    after the cell's last message), and the number of interrupts it sent."""
    executor = LimitedExecute(output_limit=LIMIT)
    executor.km = Interrupts()
    executor.reset_execution_trackers()
    executor.clear_before_next_output = False  # as nbclient sets them before a cell
    executor._cell_bytes, executor._flooded = 0, False
    outs = []

    async def feed():
        for msg in messages:
            executor.output(outs, msg, None, 0)
        await asyncio.sleep(0)  # the interrupt is sent from a task

    asyncio.run(feed())
    if reply is not None:
        executor.on_cell_executed(cell=NotebookNode(outputs=outs), cell_index=0,
                                  execute_reply={"content": reply})
    return outs, executor.km.count


def pieces(text, size):
    return [stream(text[i:i + size]) for i in range(0, len(text), size)]


def test_a_flood_keeps_the_same_text_in_any_pieces():
    flood = LINE * 50  # 5 x the cap
    kept = {}
    for size in (len(flood), 1_000, 300, 100, 7):
        outs, interrupts = capped(pieces(flood, size))
        assert interrupts == 1, size
        kept[size] = [dict(o) for o in outs]
    assert all(outs == [{"output_type": "stream", "name": "stdout", "text": flood[:LIMIT]}]
               for outs in kept.values()), kept


def test_within_the_cap_every_piece_is_kept_as_one_output_per_stream_run():
    text = LINE * 4  # 808 characters in all, within the cap
    outs, interrupts = capped(pieces(text, 30) + [stream("warning\n", "stderr")] + pieces(text, 70))
    assert interrupts == 0
    assert [(o.name, o.text) for o in outs] == [("stdout", text), ("stderr", "warning\n"),
                                                 ("stdout", text)]


def test_a_display_past_the_cap_is_dropped_whole_and_so_is_how_the_cell_ended():
    """After the cap the kernel's own error (the interrupt on an idle host, a MemoryError from
    unsent output on a busy one) is dropped: the executor records one OutputLimitError."""
    image = message("display_data", {"data": {"text/plain": "y" * 600}, "metadata": {}})
    for ename in ("KeyboardInterrupt", "MemoryError"):
        ending = {"status": "error", "ename": ename, "evalue": "", "traceback": [ename]}
        error = message("error", ending)
        outs, interrupts = capped([stream(LINE * 5), image, stream(LINE), error], reply=ending)
        assert interrupts == 1
        assert [o.output_type for o in outs] == ["stream"], ename
        assert outs[0].text == LINE * 5  # the display crossed the cap: nothing after it is kept


def test_an_error_within_the_cap_is_kept():
    error = message("error", {"ename": "ValueError", "evalue": "bad shape", "traceback": []})
    outs, interrupts = capped([stream(LINE * 2), error, stream(LINE)])
    assert interrupts == 0
    assert [(o.output_type, o.get("ename")) for o in outs] == [("stream", None), ("error", "ValueError"),
                                                               ("stream", None)]


def test_an_error_no_output_named_is_still_recorded_from_the_reply():
    """Without a flood nbgrader's hook still adds the reply's error that no output named (as
    after a timeout, whose reply is nbgrader's ``CellTimeoutError``)."""
    reply = {"status": "error", "ename": "CellTimeoutError", "evalue": "", "traceback": ["late"]}
    outs, interrupts = capped([stream(LINE)], reply=reply)
    assert interrupts == 0
    assert [(o.output_type, o.get("ename")) for o in outs] == [("stream", None),
                                                               ("error", "CellTimeoutError")]
