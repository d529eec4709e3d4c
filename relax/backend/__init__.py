"""Kernel libraries by target family: ``cpu`` (the kernel families that ``AlterLayout`` puts in
place on LLVM CPU targets, each with its plan, TE compute, weight packing and schedule,
registered by rule name) and ``gpu`` (the kernel families of the OpenCL / WebGPU default
schedules).

Examples
--------
>>> from tilecraft.relax.backend import cpu
>>> cpu.KERNELS.family("tilecraft.winograd_gemm").name
'winograd'
"""
