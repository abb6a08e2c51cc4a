"""Models: the unrolled video denoisers (UT, DUST) and small transformers built from configs.

Import the submodule you need (``descentlab.models.unrolled``, ``descentlab.models.dust``, ...); this package
imports nothing itself, so loading one model never pays for another's dependencies.
"""
