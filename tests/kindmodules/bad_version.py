"""A kind module whose registration raises: the schema version is a string."""

from checkpoints.kinds import Identity, Phase, VersionSpec, register

register("testmod.badversion", "1", VersionSpec(lambda p: None, lambda p: Phase("stable", ""),
                                                 lambda p: Identity()))
