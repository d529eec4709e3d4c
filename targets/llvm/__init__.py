"""The LLVM back end: TensorIR -> LLVM IR (through ``llvmlite.ir``) -> host JIT, object files and
shared libraries for any triple LLVM knows.

Importing this package does not import llvmlite; ``targets.build`` loads ``targets.llvm.compiler``
(which does) when it first compiles for an LLVM target, so the runtime stays usable without it.

Modules: ``codegen`` (expressions, statements, vectorized and parallel loops), ``entry``
(argument-checking entry points), ``fp16`` and ``intrinsics`` (math lowering), ``threadpool``
(the multi-core runtime, written in LLVM IR), ``compiler`` (target machines, optimization, JIT,
export).
"""
