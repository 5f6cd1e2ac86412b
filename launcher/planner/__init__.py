"""From Topology x ModelSpec x Policy to a Plan: the hardware table (every efficiency constant),
memory (memfit), speed (costmodel), candidate search (layouts), alternatives (whatif), settings
and reasons (explain), multi-node, and plan() itself. Pure: no I/O.
"""
