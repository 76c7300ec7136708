"""What is simulated: the workloads and their kernel traces. Routing generators
(``routing``: which tokens go to which expert) and graph generators (``graphs``), the MoE,
GNN and dense MLP layers with the hand-written trace of each (``moe_layer``, ``gnn_layer``,
``mlp_layer``), the ways each layer can run (``backends``), their memory needs checked
against a device (``memory``), the fleet's reference layers (``reference``) and ``Workload``
(``workload``: a name, a kernel trace and how to run it, with its FLOPs and bytes moved).

Imports ``costmodel`` only; never the other folders of ``sim``.
"""
