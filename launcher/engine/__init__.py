"""From a Plan to a running engine: the vLLM command (enginecmd, render), which vLLM is installed
(detect), plan files, the launch spec, supervision and the readers of vLLM's log (failures,
kvrefusal, progress).
"""
