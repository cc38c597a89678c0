# SPDX-License-Identifier: MIT
"""The wheel carries native code (libgnmr-agent.so, gnmrd, gnmrctl) but no
Python extension: platlib, tagged py3-none-PLATFORM, so that any CPython
3.10+ loads it and auditwheel can repair it."""
from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.dist import Distribution


class NativeDistribution(Distribution):
    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    def get_tag(self):
        return ("py3", "none") + super().get_tag()[2:]


setup(distclass=NativeDistribution, cmdclass={"bdist_wheel": PlatformWheel})
