"""Layers across ranks: expert-parallel plans (``ep_plan``), where experts live
(``expert_placement``), a real expert-parallel MoE layer on ``torch.distributed``
(``ep_layer``), its process launcher (``launch``) and step timing (``step_timing``)."""
