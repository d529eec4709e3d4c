"""The LLVM back end: TensorIR -> LLVM IR text (``llvmir``) -> object files, linked into
shared libraries (loaded in-process for the host) for any triple LLVM knows.

Every module here needs llvmlite, so importing this package imports it, or raises
``tilecraft.optional.MissingDependencyError`` saying ``pip install tilecraft`` (a board profile
has no compiler). Nothing imports this package until ``targets.build`` first compiles for an LLVM
target (``targets.llvm.compiler``), so the runtime stays usable without llvmlite.

Modules: ``llvmir`` (LLVM IR built as text, with the part of ``llvmlite.ir``'s API the others
use), ``codegen`` (expressions, statements, vectorized and parallel loops), ``entry``
(argument-checking entry points), ``fp16`` and ``intrinsics`` (math lowering), ``threadpool``
(the multi-core runtime, written in LLVM IR), ``compiler`` (target machines, optimization,
loading on the host, export).
"""
from tilecraft.optional import import_optional

import_optional("llvmlite.binding", "compiling for a CPU (the LLVM back end of targets.build)")
