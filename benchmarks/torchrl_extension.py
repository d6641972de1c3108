"""Rebuild torchrl's compiled extension (torchrl/_torchrl*.so) against the installed torch.

The registry's torchrl wheel carries a CPU-only binary built for one torch release; under
another torch it fails to load (undefined symbol) and TorchRL's PrioritizedSampler, whose
sum and min trees live in that binary, cannot run. The wheel ships the C++ and CUDA
sources (torchrl/csrc) but no build script, so this builds them with torch's own
extension machinery, which supplies the include paths, the C++ standard, the ABI flag and
TORCH_EXTENSION_NAME:

    python benchmarks/torchrl_extension.py          # CPU trees (benchmarks/setup_peers.sh)
    python benchmarks/torchrl_extension.py --cuda   # also TorchRL's CUDA trees, which its
                                                    # PrioritizedSampler uses for a storage
                                                    # on a GPU (benchmarks/gpu_check.sh)

The registry's binary is kept beside the new one as ``<name>.orig``. Exits non-zero, with
the compiler's message, when the build fails; prints the path it wrote otherwise.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile


def rebuild(cuda: bool) -> str:
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    spec = importlib.util.find_spec("torchrl")
    if spec is None or spec.origin is None:
        raise SystemExit("torchrl is not installed")
    pkg = os.path.dirname(spec.origin)
    csrc = os.path.join(pkg, "csrc")
    sources = sorted(glob.glob(os.path.join(csrc, "*.cpp")))
    if not sources:
        raise SystemExit(f"no C++ sources in {csrc}")
    if cuda:
        kernels = sorted(glob.glob(os.path.join(csrc, "*.cu")))
        if not kernels:
            raise SystemExit(f"no CUDA sources in {csrc}")
        # pybind.cpp registers the CUDA trees only under WITH_CUDA, as torchrl's own
        # GPU builds define it.
        ext = CUDAExtension("torchrl._torchrl", sources + kernels, include_dirs=[csrc],
                            define_macros=[("WITH_CUDA", None)],
                            extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"]})
    else:
        ext = CppExtension("torchrl._torchrl", sources, include_dirs=[csrc],
                           extra_compile_args=["-O3"])
    build = tempfile.mkdtemp(prefix="torchrl-ext-")
    try:
        # ninja compiles the sources in parallel where it is installed.
        use_ninja = shutil.which("ninja") is not None
        setup(name="torchrl-extension-rebuild", ext_modules=[ext],
              cmdclass={"build_ext": BuildExtension.with_options(use_ninja=use_ninja)},
              script_args=["-q", "build_ext", "--build-lib", build,
                           "--build-temp", os.path.join(build, "tmp")])
        name = "_torchrl" + sysconfig.get_config_var("EXT_SUFFIX")
        target = os.path.join(pkg, name)
        if os.path.exists(target) and not os.path.exists(target + ".orig"):
            shutil.copy2(target, target + ".orig")  # the registry's binary, for reference
        shutil.copy2(os.path.join(build, "torchrl", name), target)
        return target
    finally:
        shutil.rmtree(build, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuda", action="store_true",
                        help="also build TorchRL's CUDA segment trees (needs nvcc)")
    args = parser.parse_args(argv)
    print(f"torchrl_extension: rebuilt {rebuild(args.cuda)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
