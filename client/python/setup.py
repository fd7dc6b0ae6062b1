"""The wheel bundles libgradsync.so (gradsync/lib/, see scripts/build-wheel.sh),
a native library: it is a platform wheel (py3-none-<platform>), not a pure
py3-none-any one. The package itself is pure Python (ctypes), so any Python 3
of that platform can use it. Everything else is in pyproject.toml."""
from setuptools import Distribution, setup
from wheel.bdist_wheel import bdist_wheel


class NativeLibraryDistribution(Distribution):
    """Installs to platlib, at the wheel's root, like any package with a .so."""

    def has_ext_modules(self) -> bool:
        return True


class PlatformWheel(bdist_wheel):
    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform  # no Python extension: any Python 3


setup(distclass=NativeLibraryDistribution, cmdclass={"bdist_wheel": PlatformWheel})
