"""Entry point of the ``torch.backends`` group: ``import torch`` calls :func:`autoload`.

It only installs the post-import hooks (no Hugging Face library is imported here), so plain
``import torch`` stays cheap; each fix applies when its library module is first imported.
"""

from __future__ import annotations


def autoload() -> None:
    """Arms the Hugging Face glue."""
    from neuron_hf import install

    install()
