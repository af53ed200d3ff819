"""accelerate's own test script (what ``accelerate test`` runs), with its FP16 check skipped.

accelerate refuses fp16 mixed precision on devices outside its list (neuron included: Trainium
trains in bf16), yet its test script runs an FP16 check whenever ``is_fp16_available()`` says
yes, which it does everywhere but Gaudi 1. Reporting fp16 as unavailable on neuron, as accelerate
does for Gaudi 1, is a Hugging Face glue matter (neuron-hf); here it is emulated so every other
check of the script runs on the "neuron" backend. The BF16 check still runs.
"""

from __future__ import annotations

import runpy

import accelerate.utils

accelerate.utils.is_fp16_available = lambda: False
runpy.run_path(accelerate.utils.imports.__file__.replace("utils/imports.py", "test_utils/scripts/test_script.py"), run_name="__main__")
