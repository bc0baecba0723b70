"""``fusekit_group_norm``: decomposed group norms (Keras
``GroupNormalization``, ``nn.GroupNorm`` channels-first between
transposes, the same math by hand), proven by fusion/norms.py and
fusion/group_norm_nchw.py; the op carries the number of groups."""

from __future__ import annotations

from fusekit.passes.fusion.norms import NormMatch
from fusekit.passes.fusion.units.norm import NormUnit


class GroupNormFusion(NormUnit):
    kind = "group_norm"
    # A fused group norm's output may be what the next one groups (two in a
    # row): look again until nothing more is found.
    repeat = True

    def attrs(self, match: NormMatch) -> dict[str, float | int]:
        return {"epsilon": match.epsilon, "groups": match.groups}
