"""Running generated kernels on CPU tensors through Triton's interpreter.

``patch_interpreter()`` mends two gaps of Triton 3.6's interpreter; the runtime, the tuner and the
tests apply it before running a kernel through the interpreter (idempotent):

- it stores bf16 values as raw uint16 and its ``tl.dot`` multiplies those bit patterns as
  integers, so any bf16 dot is wrong there (fp16/fp32/fp8 dots are right): ``create_dot`` converts
  bf16 operands to fp32 first -- the same math the tensor cores do (bf16 products are exact in
  fp32, accumulation in fp32);
- it has no tensor-descriptor reduce (``desc.atomic_add``, a TMA reduce-add on sm90; the sm90
  backward adds dQ tiles that way): ``create_descriptor_reduce`` is added as an element-wise atomic
  add over the descriptor's block (rows and columns past the tensor's end masked off, as the copy
  engine clips them).
- its fp32 -> fp8 e4m3 downcast rounds wrongly: a tie goes away from zero and a mantissa that
  rounds up past its last value loses the carry into the exponent (1.95 -> 1.0, 100 -> 104, where
  round-to-nearest-even gives 2.0 and 96; upstream triton issue 8322), and values past 448 are not
  saturated: ``create_fp_to_fp`` converts to e4m3 through torch's float8_e4m3fn (round to nearest
  even) after clamping to +-448, as the GPU's saturating conversion (cvt.rn.satfinite) does.

Four changes of speed only, the same values computed (the CPU suite's interpreter tests are most of
its time): a ``@triton.jit`` helper called inside a kernel skips the interpreter's re-patching of
``triton.language`` when the launch in progress already patched every language module the helper
sees (it re-patched all of them on every call: a tenth of a backward kernel test's time); the
numpy dtype of a Triton dtype is looked up once (the interpreter rebuilt a 19-entry table per call);
and the integer overflow check of ``+``, ``-`` and ``*`` on 32-bit operands is skipped when the
interpreter does not run in debug mode. That check recomputes each operation in int64, compares
the result with the type's bounds and hands the condition to ``device_assert``, which drops it
outside debug mode (as the compiler does on a GPU): the work was done and thrown away, about a
third of a backward kernel test's time. In debug mode the check runs as before. Fourth, block types
and tensors of an integer shape seen before are built from a cache (``_patch_shapes``): Triton's
constructors rebuilt the shape's tuple, its tuple type and that type's name at every operation of
every program (a backward kernel test: 18.6 / 17.4 s -> 13.6 / 12.0 s).
"""

from __future__ import annotations

import functools

import numpy as np

_PATCHED = False
ORIGINAL_CREATE_DOT = None  # the interpreter's own create_dot, kept for the test that shows the bug
ORIGINAL_FP_TO_FP = None  # the interpreter's own create_fp_to_fp (the fp8 downcast's test)
ORIGINAL_HELPER_CALL = None  # the interpreter's own InterpretedFunction.__call__ (the speed test's)
ORIGINAL_OVERFLOW_CHECK = None  # the interpreter semantic's own overflow check (the speed test's)
ORIGINAL_BLOCK_TYPE_INIT = None  # Triton's own block_type / tensor constructors (the shape cache's test)
ORIGINAL_TENSOR_INIT = None
E4M3_MAX = 448.0


def patch_interpreter() -> None:
    global _PATCHED, ORIGINAL_CREATE_DOT, ORIGINAL_FP_TO_FP
    if _PATCHED:
        return
    import triton.language as tl
    from triton.runtime import interpreter as ti

    original = ORIGINAL_CREATE_DOT = ti.InterpreterBuilder.create_dot

    @functools.wraps(original)
    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            a = _bf16_to_f32(a)
            b = _bf16_to_f32(b)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot._attngen_patched = True
    ti.InterpreterBuilder.create_dot = create_dot
    to_fp = ORIGINAL_FP_TO_FP = ti.InterpreterBuilder.create_fp_to_fp

    @functools.wraps(to_fp)
    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if dst_type.scalar == tl.float8e4nv and src.dtype.scalar in (tl.float32, tl.float16, tl.bfloat16):
            return _to_e4m3(src)
        return to_fp(self, src, dst_type, rounding_mode)

    ti.InterpreterBuilder.create_fp_to_fp = create_fp_to_fp
    if not hasattr(ti.InterpreterBuilder, "create_descriptor_reduce"):
        ti.InterpreterBuilder.create_descriptor_reduce = _create_descriptor_reduce
    _patch_speed(ti, tl)
    _PATCHED = True


def _patch_speed(ti, tl) -> None:
    """The four speed changes of the module doc."""
    global ORIGINAL_HELPER_CALL, ORIGINAL_OVERFLOW_CHECK
    launches: list[frozenset] = []  # the language modules each launch in progress patched
    seen: dict = {}

    def langs(fn) -> frozenset:  # as the interpreter's _patch_lang finds them
        key = seen.get(fn)
        if key is None:
            key = seen[fn] = frozenset(id(v) for v in list(fn.__globals__.values())
                                       if isinstance(v, type(tl)) and (v is tl or v is tl.core))
        return key

    grid_call = ti.GridExecutor.__call__

    @functools.wraps(grid_call)
    def launch(self, *args, **kwargs):
        launches.append(langs(self.fn))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            launches.pop()

    helper_call = ORIGINAL_HELPER_CALL = ti.InterpretedFunction.__call__

    @functools.wraps(helper_call)
    def call(self, *args, **kwargs):
        if not launches:
            return helper_call(self, *args, **kwargs)
        mine = langs(self.fn)
        if not mine <= launches[-1]:
            # the interpreter patches them first thing (Triton's standard library sees
            # triton.language.core, a kernel module triton.language) and never restores them
            launches[-1] |= mine
            return helper_call(self, *args, **kwargs)
        fn = self.rewrite()  # Triton 3.6's InterpretedFunction.__call__ without its _patch_lang
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise ti.InterpreterError(repr(e)) from e

    ti.GridExecutor.__call__ = launch
    ti.InterpretedFunction.__call__ = call
    np_dtype = ti._get_np_dtype
    table: dict = {}

    @functools.wraps(np_dtype)
    def get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):  # a block's is its element's (pointers: uint64 both)
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, tl.pointer_type):  # (not hashable)
            return np_dtype(tt_dtype)
        out = table.get(tt_dtype)
        if out is None:
            out = table[tt_dtype] = np_dtype(tt_dtype)
        return out

    ti._get_np_dtype = get_np_dtype
    # the interpreter makes a TritonSemantic per patched builtin, so the class's method is wrapped;
    # a compile for a GPU (another builder) takes the original path
    semantic = type(ti.interpreter_semantic)
    check = ORIGINAL_OVERFLOW_CHECK = semantic.binary_op_sanitize_overflow_impl

    @functools.wraps(check)
    def overflow_check(self, lhs, rhs, binary_op):
        if isinstance(self.builder, ti.InterpreterBuilder) and not self.builder.options.debug:
            return None  # device_assert would drop the condition (module doc)
        return check(self, lhs, rhs, binary_op)

    semantic.binary_op_sanitize_overflow_impl = overflow_check
    _patch_shapes(tl.core)


def _patch_shapes(core) -> None:
    """Block types and tensors of an integer shape seen before are made from a cache: the same
    attributes as Triton's constructors give them (a shape of ints, `numel`, `name`; a tensor's shape
    of constexprs), without rebuilding the shape's tuple and its type name from scratch at every
    operation. Any other shape (symbolic, bool or empty entries, a builtin tuple, which Triton's
    block_type refuses) takes Triton's own path, and so does a shape's first construction, whose
    errors (a dimension not a power of two, too many elements) are Triton's."""
    global ORIGINAL_BLOCK_TYPE_INIT, ORIGINAL_TENSOR_INIT
    import builtins

    tl_tuple, constexpr = core.tuple, core.constexpr
    block_init = ORIGINAL_BLOCK_TYPE_INIT = core.block_type.__init__
    tensor_init = ORIGINAL_TENSOR_INIT = core.tensor.__init__
    blocks: dict = {}  # shape -> (ints, their tuple type, numel, str of the shape)
    tensors: dict = {}  # shape -> (constexprs, their tuple type, numel as a constexpr)

    def key_of(shape):
        vals = shape.values if type(shape) is tl_tuple else shape
        if type(vals) is not list:
            return None
        out = []
        for v in vals:
            if type(v) is constexpr:
                v = v.value
            if type(v) is not int:
                return None
            out.append(v)
        return builtins.tuple(out) or None

    def shape_tuple(values, tuple_type):  # a fresh tl.tuple (its own list) of shared entries
        t = object.__new__(tl_tuple)
        t.values = list(values)
        t.type = tuple_type
        return t

    @functools.wraps(block_init)
    def block_type_init(self, element_ty, shape):
        key = key_of(shape)  # None unless a list or tl.tuple of ints (Triton refuses a builtin tuple)
        ent = blocks.get(key) if key is not None else None
        if ent is None:
            block_init(self, element_ty, shape)
            if key is not None:
                blocks[key] = (builtins.tuple(self.shape.values), self.shape.type, self.numel, str(self.shape))
                self._attngen_shape = key
            return
        self._attngen_shape = key  # the tensors of this type look their shape up by it
        self.element_ty = element_ty
        self.shape = shape_tuple(ent[0], ent[1])
        self.numel = ent[2]
        self.name = f"<{ent[3]}, {element_ty}>"

    @functools.wraps(tensor_init)
    def tensor_init_cached(self, handle, type):
        key = type.__dict__.get("_attngen_shape") if type.is_block() else None
        ent = tensors.get(key) if key is not None else None
        if ent is None:
            tensor_init(self, handle, type)
            if key is not None:
                tensors[key] = (builtins.tuple(self.shape.values), self.shape.type, self.numel)
            return
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        self.shape = shape_tuple(ent[0], ent[1])
        self.numel = ent[2]

    core.block_type.__init__ = block_type_init
    core.tensor.__init__ = tensor_init_cached


def _create_descriptor_reduce(self, kind, desc, value, indices):
    from triton._C.libtriton import ir

    if kind != ir.DESCRIPTOR_REDUCE_KIND.ADD:
        raise NotImplementedError(f"attngen's interpreter patch has only the add reduce, not {kind}")
    ptrs, mask = desc.materialize_pointers(indices)
    op = ir.ATOMIC_OP.FADD if value.dtype.scalar.is_floating() else ir.ATOMIC_OP.ADD
    return self.create_atomic_rmw(op, ptrs, value, mask, ir.MEM_SEMANTIC.RELAXED, ir.MEM_SYNC_SCOPE.GPU)


def _bf16_to_f32(h):
    import triton.language as tl
    from triton.runtime import interpreter as ti

    if h.dtype.scalar != tl.bfloat16:
        return h
    bits = h.data.astype(np.uint32) << 16  # bf16 is the top half of an fp32
    return ti.TensorHandle(bits.view(np.float32), tl.float32)




def _to_e4m3(h):
    """fp32 / fp16 / bf16 interpreter values -> e4m3 bytes: round to nearest even, saturating."""
    import torch
    import triton.language as tl
    from triton.runtime import interpreter as ti

    x = _bf16_to_f32(h).data.astype(np.float32)
    t = torch.from_numpy(np.ascontiguousarray(x)).clamp(-E4M3_MAX, E4M3_MAX)
    return ti.TensorHandle(t.to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(x.shape), tl.float8e4nv)
