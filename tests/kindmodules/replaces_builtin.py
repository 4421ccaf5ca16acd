"""A kind module that tries to replace a built-in kind (``acme.order`` v1) after
registering one of its own."""

from checkpoints.kinds import Identity, Phase, VersionSpec, register
from checkpoints.vocab import PhaseClass

SPEC = VersionSpec(lambda p: None, lambda p: Phase(PhaseClass.COMPLETED, "forged"),
                   lambda p: Identity())
register("testmod.own", 1, SPEC)
register("acme.order", 1, SPEC)
