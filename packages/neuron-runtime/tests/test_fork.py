"""Fork safety: a child of an initialised parent gets a clear error, not a crash."""

from __future__ import annotations


def test_bad_fork_gives_clear_error(python_in_subprocess):
    result = python_in_subprocess(
        """
        import multiprocessing as mp, re, torch

        def child(q):
            try:
                torch.ones(1, device="neuron")
                q.put("no error")
            except RuntimeError as e:
                # the wording of torch.cuda's error, which PyTorch's test_utils.py matches
                q.put(re.search(r"Cannot re-initialize .* in forked subprocess\\. To use .* with "
                                r"multiprocessing, you must use the 'spawn' start method", str(e)) is not None)

        torch.ones(1, device="neuron")  # initialise in the parent
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start(); p.join(60)
        print("child", q.get(timeout=10), p.exitcode)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "child True 0" in result.stdout


def test_dataloader_workers_that_do_not_touch_the_device_work(python_in_subprocess):
    result = python_in_subprocess(
        """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.ones(1, device="neuron")
        data = TensorDataset(torch.arange(32.0).reshape(16, 2))
        loader = DataLoader(data, batch_size=4, num_workers=2, multiprocessing_context="fork", pin_memory=True)
        total = sum(batch[0].to("neuron").sum().item() for batch in loader)
        print("total", total)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "total 496.0" in result.stdout
