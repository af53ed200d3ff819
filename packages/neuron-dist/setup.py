"""Builds neuron_dist._C, the Backend type that lets torch's ProcessGroup hold the neuron backend."""
import glob
import os

# Building must not load an installed (possibly stale) neuron runtime through torch's
# backend autoloading.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
_sources = sorted(os.path.relpath(p, _HERE) for p in glob.glob(os.path.join(_HERE, "csrc", "*.cpp")))

setup(
    ext_modules=[
        CppExtension(
            name="neuron_dist._C",
            sources=_sources,
            include_dirs=[os.path.join(_HERE, "csrc")],
            extra_compile_args=["-O2", "-fvisibility=hidden"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
