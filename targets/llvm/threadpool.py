"""The multi-core runtime of parallel loops, written in LLVM IR over pthreads.

It needs no Python: an exported library carries its own copy, so a C program on a board gets
parallel kernels too. Two functions form its whole interface (the code generator calls only
these, so the implementation can be swapped):

``int32_t tilecraft_rt_parallel_launch(int32_t (*task)(int32_t, int32_t, void*), void *closure,
int32_t num_tasks)``
    Run ``task(i, num_tasks, closure)`` for every ``i`` in ``[0, num_tasks)``, task 0 on the
    calling thread, and return the first nonzero result (0 if all succeed).
``int32_t tilecraft_rt_num_cores(void)``
    ``sysconf(_SC_NPROCESSORS_ONLN)``, cached (the default thread count).

The pool is persistent: workers are created on first need (up to ``MAX_WORKERS``), detached,
and then wait for jobs, spinning briefly on an atomic generation counter before sleeping on a
condition variable, so launching a small kernel costs microseconds, not a ``pthread_create``.
Launches from several threads are serialized by a lock. Each worker task is *claimed*
(an atomic exchange on its slot) by its worker or, once the caller has finished task 0, by the
caller, which runs every task no worker has started: a worker descheduled by another process
(or still waking up) then delays nothing, and a worker that wakes up late finds its slot taken
and does not touch the finished job. After ``fork()`` (noticed through
``getpid()``) the child starts a fresh pool. Mutexes and condition variables are zero-initialized
storage of 64 bytes, which is ``PTHREAD_MUTEX_INITIALIZER`` / ``PTHREAD_COND_INITIALIZER`` on
glibc and musl and larger than either's objects on every supported architecture.

pthread symbols are resolved by the dynamic loader (libc on glibc >= 2.34, libpthread before;
an exported library for a glibc triple names libpthread.so.0 as needed, see ``docs/abi.md``).
At most ``min(num_tasks, online cores)`` tasks run: more would only make spinning workers fight
over cores.
"""
from __future__ import annotations

from . import llvmir as ir

from .irutil import I32, PTR, VOID, ModuleBuilder, gep

LAUNCH = "tilecraft_rt_parallel_launch"
NUM_CORES = "tilecraft_rt_num_cores"
MAX_WORKERS = 255          # threads besides the caller
TASK_MASK = 511            # low bits of the job word: the task count (<= MAX_WORKERS + 1)
SPIN_PAUSE = 4000         # polls with a pause hint...
SPIN = 30000              # ...then with sched_yield() up to this many, then sleep (~10 ms)
SC_NPROCESSORS_ONLN = 84   # the value of _SC_NPROCESSORS_ONLN on Linux (glibc and musl)
SYNC_BYTES = 64


def emit_runtime(mb: ModuleBuilder, arch: str, visibility: str = "default") -> None:
    """Define the runtime's two functions (and its private state) in ``mb``'s module."""
    _Runtime(mb, arch, visibility).emit()


class _Runtime:
    def __init__(self, mb: ModuleBuilder, arch: str, visibility: str):
        self.mb = mb
        self.m = mb.module
        self.arch = arch
        self.visibility = visibility
        ip = mb.intptr
        d = mb.declare
        self.pthread_create = d("pthread_create", I32, [PTR, PTR, PTR, PTR])
        self.pthread_detach = d("pthread_detach", I32, [ip])
        self.lock_fn = d("pthread_mutex_lock", I32, [PTR])
        self.unlock_fn = d("pthread_mutex_unlock", I32, [PTR])
        self.wait_fn = d("pthread_cond_wait", I32, [PTR, PTR])
        self.broadcast_fn = d("pthread_cond_broadcast", I32, [PTR])
        self.signal_fn = d("pthread_cond_signal", I32, [PTR])
        self.getpid = d("getpid", I32, [])
        self.sched_yield = d("sched_yield", I32, [])
        self.sysconf = d("sysconf", ip, [I32])
        sync_ty = ir.ArrayType(ir.IntType(8), SYNC_BYTES)

        def g(name, ty, init=None, align=None):
            return mb.global_var("tilecraft_rt." + name, ty, init, linkage="internal",
                                 align=align)

        self.pool_lock = g("pool_lock", sync_ty, align=16)
        self.work_cv = g("work_cv", sync_ty, align=16)
        self.done_cv = g("done_cv", sync_ty, align=16)
        self.launch_lock = g("launch_lock", sync_ty, align=16)
        self.pool_pid = g("pool_pid", I32, I32(0))
        self.init_flag = g("init_flag", I32, I32(0))
        self.nworkers = g("nworkers", I32, I32(0))
        # the job word: generation << 9 | number of tasks (a worker needs both at once)
        self.job = g("job", I32, I32(0))
        self.job_fn = g("job_fn", PTR)
        self.job_closure = g("job_closure", PTR)
        self.pending = g("pending", I32, I32(0))
        self.job_error = g("job_error", I32, I32(0))
        self.cores = g("cores", I32, I32(0))
        self.gen0 = g("worker_gen0", ir.ArrayType(I32, MAX_WORKERS + 1))
        # per task slot: the job word while the task is unclaimed, 0 once a thread took it
        self.slot_job = g("slot_job", ir.ArrayType(I32, MAX_WORKERS + 1))
        self.task_ty = ir.FunctionType(I32, [I32, I32, PTR])

    # -- small builders -------------------------------------------------------------------------
    def _fn(self, name, ret, args, linkage="internal"):
        fn = ir.Function(self.m, ir.FunctionType(ret, args), name)
        fn.attributes.add("nounwind")
        if linkage == "internal":
            fn.linkage = "internal"
        else:
            fn.visibility = self.visibility
        return fn

    @staticmethod
    def _load(b, ptr, ordering="acquire"):
        v = b.load_atomic(ptr, ordering, 4, typ=I32)
        return v

    @staticmethod
    def _store(b, value, ptr, ordering="release"):
        b.store_atomic(value, ptr, ordering, 4)

    def _backoff(self, b, k):
        """Between two polls: a pause hint at first, then sched_yield() so that spinning
        workers give their core away when threads outnumber cores."""
        fn = b.function
        pause_bb, yield_bb, cont_bb = (fn.append_basic_block("pause"),
                                       fn.append_basic_block("yield"),
                                       fn.append_basic_block("backoff.done"))
        b.cbranch(b.icmp_signed("<", k, I32(SPIN_PAUSE)), pause_bb, yield_bb)
        b.position_at_end(pause_bb)
        self._pause(b)
        b.branch(cont_bb)
        b.position_at_end(yield_bb)
        b.call(self.sched_yield, [])
        b.branch(cont_bb)
        b.position_at_end(cont_bb)

    def _pause(self, b):
        """A spin-wait hint (x86 ``pause``, Arm ``yield``), through intrinsics: inline assembly
        would need an assembly parser for every target."""
        if self.arch in ("x86_64", "x86"):
            b.call(self.mb.declare("llvm.x86.sse2.pause", VOID, []), [])
        elif self.arch in ("aarch64", "arm"):
            b.call(self.mb.declare(f"llvm.{self.arch}.hint", VOID, [I32]), [I32(1)])

    def emit(self):
        self._emit_num_cores()
        worker = self._emit_worker()
        self._emit_launch(worker)

    # -- tilecraft_rt_num_cores -----------------------------------------------------------------
    def _emit_num_cores(self):
        fn = self._fn(NUM_CORES, I32, [], linkage="external")
        self.num_cores_fn = fn
        entry, query, done = (fn.append_basic_block("entry"), fn.append_basic_block("query"),
                              fn.append_basic_block("done"))
        b = ir.IRBuilder(entry)
        cached = self._load(b, self.cores, "monotonic")
        b.cbranch(b.icmp_signed(">", cached, I32(0)), done, query)
        b.position_at_end(query)
        n = b.call(self.sysconf, [I32(SC_NPROCESSORS_ONLN)])
        n = b.trunc(n, I32) if self.mb.pointer_bits == 64 else n
        n = b.select(b.icmp_signed("<", n, I32(1)), I32(1), n)
        n = b.select(b.icmp_signed(">", n, I32(MAX_WORKERS + 1)), I32(MAX_WORKERS + 1), n)
        self._store(b, n, self.cores, "monotonic")
        b.branch(done)
        b.position_at_end(done)
        phi = b.phi(I32)
        phi.add_incoming(cached, entry)
        phi.add_incoming(n, query)
        b.ret(phi)

    # -- the worker thread ----------------------------------------------------------------------
    def _emit_worker(self):
        fn = self._fn("tilecraft_rt.worker", PTR, [PTR])
        arg = fn.args[0]
        bb = {k: fn.append_basic_block(k) for k in
              ("entry", "wait", "spin", "spin.next", "sleep", "sleep.check", "sleep.wait",
               "sleep.got", "got", "run", "last")}
        b = ir.IRBuilder(bb["entry"])
        my_slot = b.alloca(I32, name="my_job")
        k_slot = b.alloca(I32, name="spins")
        idx = b.ptrtoint(arg, self.mb.intptr)
        idx = b.trunc(idx, I32) if self.mb.pointer_bits == 64 else idx
        g0 = b.load(gep(b, self.gen0, [I32(0), idx], self.gen0.value_type), typ=I32)
        b.store(g0, my_slot)
        b.branch(bb["wait"])
        # spin a while on the job word...
        b.position_at_end(bb["wait"])
        b.store(I32(0), k_slot)
        b.branch(bb["spin"])
        b.position_at_end(bb["spin"])
        w_spin = self._load(b, self.job)
        b.cbranch(b.icmp_signed("!=", w_spin, b.load(my_slot, typ=I32)), bb["got"],
                  bb["spin.next"])
        b.position_at_end(bb["spin.next"])
        self._backoff(b, b.load(k_slot, typ=I32))
        k = b.add(b.load(k_slot, typ=I32), I32(1))
        b.store(k, k_slot)
        b.cbranch(b.icmp_signed("<", k, I32(SPIN)), bb["spin"], bb["sleep"])
        # ...then sleep on the condition variable (the job word changes under the lock)
        b.position_at_end(bb["sleep"])
        b.call(self.lock_fn, [self.pool_lock])
        b.branch(bb["sleep.check"])
        b.position_at_end(bb["sleep.check"])
        w_sleep = self._load(b, self.job)
        b.cbranch(b.icmp_signed("==", w_sleep, b.load(my_slot, typ=I32)), bb["sleep.wait"],
                  bb["sleep.got"])
        b.position_at_end(bb["sleep.wait"])
        b.call(self.wait_fn, [self.work_cv, self.pool_lock])
        b.branch(bb["sleep.check"])
        b.position_at_end(bb["sleep.got"])
        b.call(self.unlock_fn, [self.pool_lock])
        b.branch(bb["got"])
        # a new job: its task count is in the word; task and closure were written before it
        b.position_at_end(bb["got"])
        w = b.phi(I32)
        w.add_incoming(w_spin, bb["spin"])
        w.add_incoming(w_sleep, bb["sleep.got"])
        b.store(w, my_slot)
        nt = b.and_(w, I32(TASK_MASK))
        claim_bb = fn.append_basic_block("claim")
        b.cbranch(b.icmp_signed("<", idx, nt), claim_bb, bb["wait"])
        # the launching thread may have run this task itself already (this worker was slow to
        # wake): then the job, its closure included, may be gone -- leave it alone
        b.position_at_end(claim_bb)
        slot = b.gep(self.slot_job, [I32(0), idx])  # typed: atomics need the element type
        claimed = b.cmpxchg(slot, w, I32(0), "acq_rel", "monotonic")
        b.cbranch(b.extract_value(claimed, 1), bb["run"], bb["wait"])
        b.position_at_end(bb["run"])
        task = b.load(self.job_fn, typ=self.task_ty.as_pointer())
        closure = b.load(self.job_closure, typ=PTR)
        rc = self._call(b, task, [idx, nt, closure])
        err_bb, count_bb = fn.append_basic_block("err"), fn.append_basic_block("count")
        b.cbranch(b.icmp_signed("!=", rc, I32(0)), err_bb, count_bb)
        b.position_at_end(err_bb)
        b.cmpxchg(self.job_error, I32(0), rc, "acq_rel", "monotonic")
        b.branch(count_bb)
        b.position_at_end(count_bb)
        old = b.atomic_rmw("sub", self.pending, I32(1), "acq_rel")
        b.cbranch(b.icmp_signed("==", old, I32(1)), bb["last"], bb["wait"])
        b.position_at_end(bb["last"])
        b.call(self.lock_fn, [self.pool_lock])
        b.call(self.signal_fn, [self.done_cv])
        b.call(self.unlock_fn, [self.pool_lock])
        b.branch(bb["wait"])
        return fn

    # -- launch ---------------------------------------------------------------------------------
    def _emit_launch(self, worker):
        # a typed pointer for the task, so llvmlite knows the signature of the indirect call
        fn = self._fn(LAUNCH, I32, [self.task_ty.as_pointer(), PTR, I32], linkage="external")
        task, closure, n_req = fn.args
        task.name, closure.name, n_req.name = "task", "closure", "num_tasks"
        blocks = ("entry", "inline", "pool", "pool2", "init.check", "init.try", "init.do", "init.wait",
                  "ready", "grow", "grow.create", "grow.ok", "grown", "wait", "wait.spin",
                  "wait.next", "wait.sleep", "wait.check", "wait.cond", "done")
        bb = {k: fn.append_basic_block(k) for k in blocks}
        b = ir.IRBuilder(bb["entry"])
        tid_slot = b.alloca(self.mb.intptr, name="tid")
        nw_slot = b.alloca(I32, name="nw")
        k_slot = b.alloca(I32, name="spins")
        b.cbranch(b.icmp_signed("<=", n_req, I32(1)), bb["inline"], bb["pool"])
        b.position_at_end(bb["inline"])
        b.ret(self._call(b, task, [I32(0), I32(1), closure]))
        # (re)initialize once per process: the first launch, or the first after a fork()
        b.position_at_end(bb["pool"])
        # more tasks than cores only makes the spinning workers fight over cores
        cores = b.call(self.num_cores_fn, [])
        n = b.select(b.icmp_signed(">", n_req, cores), cores, n_req)
        b.cbranch(b.icmp_signed("<=", n, I32(1)), bb["inline"], bb["pool2"])
        b.position_at_end(bb["pool2"])
        pid = b.call(self.getpid, [])
        b.branch(bb["init.check"])
        b.position_at_end(bb["init.check"])
        b.cbranch(b.icmp_signed("==", self._load(b, self.pool_pid), pid), bb["ready"],
                  bb["init.try"])
        b.position_at_end(bb["init.try"])
        res = b.cmpxchg(self.init_flag, I32(0), I32(1), "acq_rel", "monotonic")
        b.cbranch(b.extract_value(res, 1), bb["init.do"], bb["init.wait"])
        b.position_at_end(bb["init.do"])
        zero = ir.Constant(self.pool_lock.value_type, None)
        for obj in (self.pool_lock, self.work_cv, self.done_cv, self.launch_lock):
            b.store(zero, obj)
        b.store(I32(0), self.nworkers)
        self._store(b, I32(0), self.job)
        self._store(b, pid, self.pool_pid)
        self._store(b, I32(0), self.init_flag)
        b.branch(bb["ready"])
        b.position_at_end(bb["init.wait"])
        self._pause(b)
        b.branch(bb["init.check"])
        # grow the pool to n - 1 workers (under the launch lock)
        b.position_at_end(bb["ready"])
        b.call(self.lock_fn, [self.launch_lock])
        b.store(b.load(self.nworkers, typ=I32), nw_slot)
        b.branch(bb["grow"])
        b.position_at_end(bb["grow"])
        nw = b.load(nw_slot, typ=I32)
        b.cbranch(b.icmp_signed("<", nw, b.sub(n, I32(1))), bb["grow.create"], bb["grown"])
        b.position_at_end(bb["grow.create"])
        idx = b.add(nw, I32(1))
        b.store(self._load(b, self.job, "monotonic"),
                gep(b, self.gen0, [I32(0), idx], self.gen0.value_type))
        arg = b.inttoptr(b.zext(idx, self.mb.intptr) if self.mb.pointer_bits == 64 else idx, PTR)
        rc = b.call(self.pthread_create, [tid_slot, ir.Constant(PTR, None), worker, arg])
        b.cbranch(b.icmp_signed("==", rc, I32(0)), bb["grow.ok"], bb["grown"])
        b.position_at_end(bb["grow.ok"])
        b.call(self.pthread_detach, [b.load(tid_slot, typ=self.mb.intptr)])
        b.store(idx, nw_slot)
        b.branch(bb["grow"])
        b.position_at_end(bb["grown"])
        nw = b.load(nw_slot, typ=I32)
        b.store(nw, self.nworkers)
        ntasks = b.select(b.icmp_signed("<", nw, b.sub(n, I32(1))), b.add(nw, I32(1)), n)
        # publish the job: its fields first, then (release) the job word that announces it;
        # the word changes under the lock so that a worker about to sleep cannot miss it
        b.store(task, self.job_fn)
        b.store(closure, self.job_closure)
        b.store(I32(0), self.job_error)
        self._store(b, b.sub(ntasks, I32(1)), self.pending)
        old_word = self._load(b, self.job, "monotonic")
        next_gen = b.add(b.and_(old_word, I32(~TASK_MASK)), I32(TASK_MASK + 1))
        word = b.or_(next_gen, ntasks)
        self._for_slots(b, ntasks, lambda slot, i: self._store(b, word, slot, "monotonic"))
        b.call(self.lock_fn, [self.pool_lock])
        self._store(b, word, self.job)
        b.call(self.unlock_fn, [self.pool_lock])
        b.call(self.broadcast_fn, [self.work_cv])
        r0 = self._call(b, task, [I32(0), ntasks, closure])

        # tasks whose worker has not started yet (descheduled by another process, or still
        # waking up) run here, so the launch waits only for workers that are running a task
        def run_unclaimed(slot, i):
            claimed = b.cmpxchg(slot, word, I32(0), "acq_rel", "monotonic")
            run_bb = fn.append_basic_block("steal.run")
            next_bb = fn.append_basic_block("steal.next")
            b.cbranch(b.extract_value(claimed, 1), run_bb, next_bb)
            b.position_at_end(run_bb)
            rc = self._call(b, task, [i, ntasks, closure])
            err_bb = fn.append_basic_block("steal.err")
            count_bb = fn.append_basic_block("steal.count")
            b.cbranch(b.icmp_signed("!=", rc, I32(0)), err_bb, count_bb)
            b.position_at_end(err_bb)
            b.cmpxchg(self.job_error, I32(0), rc, "acq_rel", "monotonic")
            b.branch(count_bb)
            b.position_at_end(count_bb)
            b.atomic_rmw("sub", self.pending, I32(1), "acq_rel")
            b.branch(next_bb)
            b.position_at_end(next_bb)

        self._for_slots(b, ntasks, run_unclaimed)
        b.store(I32(0), k_slot)
        b.branch(bb["wait"])
        # wait for the other tasks: spin, then sleep
        b.position_at_end(bb["wait"])
        b.cbranch(b.icmp_signed("==", self._load(b, self.pending), I32(0)), bb["done"],
                  bb["wait.next"])
        b.position_at_end(bb["wait.next"])
        self._backoff(b, b.load(k_slot, typ=I32))
        k = b.add(b.load(k_slot, typ=I32), I32(1))
        b.store(k, k_slot)
        b.cbranch(b.icmp_signed("<", k, I32(SPIN)), bb["wait"], bb["wait.sleep"])
        b.position_at_end(bb["wait.sleep"])
        b.call(self.lock_fn, [self.pool_lock])
        b.branch(bb["wait.check"])
        b.position_at_end(bb["wait.check"])
        b.cbranch(b.icmp_signed("==", self._load(b, self.pending), I32(0)), bb["wait.spin"],
                  bb["wait.cond"])
        b.position_at_end(bb["wait.cond"])
        b.call(self.wait_fn, [self.done_cv, self.pool_lock])
        b.branch(bb["wait.check"])
        b.position_at_end(bb["wait.spin"])  # reached with the pool lock held
        b.call(self.unlock_fn, [self.pool_lock])
        b.branch(bb["done"])
        b.position_at_end(bb["done"])
        err = self._load(b, self.job_error)
        b.call(self.unlock_fn, [self.launch_lock])
        b.ret(b.select(b.icmp_signed("!=", r0, I32(0)), r0, err))

    def _for_slots(self, b, ntasks, body):
        """Emit ``body(slot_pointer, i)`` for the worker task slots ``i`` in ``[1, ntasks)``."""
        fn = b.function
        pre = b.block
        head, loop, done = (fn.append_basic_block("slots"), fn.append_basic_block("slots.body"),
                            fn.append_basic_block("slots.done"))
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I32)
        i.add_incoming(I32(1), pre)
        b.cbranch(b.icmp_signed("<", i, ntasks), loop, done)
        b.position_at_end(loop)
        body(b.gep(self.slot_job, [I32(0), i]), i)
        i.add_incoming(b.add(i, I32(1)), b.block)
        b.branch(head)
        b.position_at_end(done)

    @staticmethod
    def _call(b, fnptr, args):
        return b.call(fnptr, args)
