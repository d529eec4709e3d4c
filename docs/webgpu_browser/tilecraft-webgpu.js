// Run a module exported by tilecraft's WebGPU back end (`mod.export_library("k.json")`) with
// the browser's WebGPU: the same WGSL, bindings and launch geometry the Python runtime uses
// (targets/webgpu_backend/module.py), in plain JavaScript with no dependencies.
//
//   import { loadModule } from "./tilecraft-webgpu.js";
//   const adapter = await navigator.gpu.requestAdapter();
//   const device = await adapter.requestDevice();          // the spec's default limits suffice
//   const mod = await loadModule("softmax.json", device);
//   const x = mod.array(new Float32Array(n * 1000), [n, 1000], "float32");
//   const y = mod.empty([n, 1000], "float32");
//   await mod.call("main", x, y);                         // checks shapes, binds n, dispatches
//   const out = await mod.read(y);                        // a Float32Array
//
// Arrays are {buffer, shape, dtype}. Like the Python runtime, 8/16-bit integers and bool take
// one 32-bit word per element and int64 is held as int32 (see docs/gpu-webgpu.md).

const FORMAT = "tilecraft-webgpu";
const MAX_WORKGROUPS = 65535;
const STORAGE = {
  float32: [Float32Array, 4], float16: [Uint16Array, 2], int32: [Int32Array, 4],
  uint32: [Uint32Array, 4], int8: [Int32Array, 4], int16: [Int32Array, 4],
  int64: [Int32Array, 4], uint8: [Uint32Array, 4], uint16: [Uint32Array, 4],
  uint64: [Uint32Array, 4], bool: [Uint32Array, 4],
};

function floordiv(a, b) { return b === 0 ? 0 : Math.floor(a / b); }
function truncdiv(a, b) { return b === 0 ? 0 : Math.trunc(a / b); }
const OPS = {
  add: (a, b) => a + b, sub: (a, b) => a - b, mul: (a, b) => a * b,
  floordiv, floormod: (a, b) => (b === 0 ? 0 : a - floordiv(a, b) * b),
  div: truncdiv, mod: (a, b) => (b === 0 ? 0 : a - truncdiv(a, b) * b),
  min: Math.min, max: Math.max,
  eq: (a, b) => +(a === b), ne: (a, b) => +(a !== b), lt: (a, b) => +(a < b),
  le: (a, b) => +(a <= b), gt: (a, b) => +(a > b), ge: (a, b) => +(a >= b),
  and: (a, b) => +(!!a && !!b), or: (a, b) => +(!!a || !!b),
};

/** The value of a JSON expression tree (targets/webgpu_backend/exprjson.py). */
export function evaluate(tree, env) {
  if (typeof tree === "number") return tree;
  if (typeof tree === "boolean") return +tree;
  const head = tree[0];
  if (head === "var") {
    if (!(tree[1] in env)) throw new Error(`no value for variable ${tree[1]}`);
    return env[tree[1]];
  }
  if (head === "not") return +!evaluate(tree[1], env);
  if (head === "select") return evaluate(tree[1], env) ? evaluate(tree[2], env) : evaluate(tree[3], env);
  const op = OPS[head];
  if (!op) throw new Error(`unknown expression node ${head}`);
  return op(evaluate(tree[1], env), evaluate(tree[2], env));
}

/** Workgroup counts of one launch (a grid over 65535 is linearized, as in the shader). */
export function dispatchCounts(kernel, env) {
  const g = kernel.grid.map((x) => evaluate(x, env));
  if (Math.min(...g) <= 0) return null;
  if (!kernel.linear_grid) return g;
  const total = g[0] * g[1] * g[2];
  return [Math.min(total, MAX_WORKGROUPS), Math.ceil(total / MAX_WORKGROUPS), 1];
}

/** The bytes of a kernel's uniform struct: 4-byte fields, padded to 16 bytes. */
export function uniformBytes(kernel, env, offsets) {
  const n = kernel.uniform.length;
  const buf = new ArrayBuffer(Math.max(16, Math.ceil((4 * n) / 16) * 16));
  const view = new DataView(buf);
  kernel.uniform.forEach((u, i) => {
    const v = Array.isArray(u.value) || typeof u.value === "number"
      ? evaluate(u.value, env) : offsets[u.value.offset.join(",")];
    if (u.type === "f32") view.setFloat32(4 * i, v, true);
    else if (u.type === "u32") view.setUint32(4 * i, v, true);
    else view.setInt32(4 * i, v, true);
  });
  return new Uint8Array(buf);
}

class TilecraftModule {
  constructor(meta, device) {
    if (meta.format !== FORMAT) throw new Error("not a tilecraft WebGPU module");
    this.meta = meta;
    this.device = device;
    this.functions = Object.fromEntries(meta.functions.map((f) => [f.name, f]));
    this.pipelines = new Map();
    for (const f of meta.required_features || []) {
      if (!device.features.has(f)) throw new Error(`the module needs the WebGPU feature ${f}`);
    }
  }

  _bytes(shape, dtype) {
    const [, size] = STORAGE[dtype];
    return shape.reduce((a, b) => a * b, 1) * size;
  }

  _buffer(nbytes) {
    const U = GPUBufferUsage;
    return this.device.createBuffer({
      // a multiple of 16: kernels may bind float32 buffers as array<vec4<f32>>
      size: Math.max(16, Math.ceil(nbytes / 16) * 16),
      usage: U.STORAGE | U.COPY_SRC | U.COPY_DST,
    });
  }

  /** A device array holding `data` (a typed array of the storage type). */
  array(data, shape, dtype) {
    const buffer = this._buffer(data.byteLength);
    this.device.queue.writeBuffer(buffer, 0, data.buffer, data.byteOffset, data.byteLength);
    return { buffer, shape, dtype };
  }

  empty(shape, dtype) {
    return { buffer: this._buffer(this._bytes(shape, dtype)), shape, dtype };
  }

  /** The contents of a device array, as a typed array of its storage type. */
  async read(arr) {
    const nbytes = this._bytes(arr.shape, arr.dtype);
    const size = Math.max(4, Math.ceil(nbytes / 4) * 4);
    const staging = this.device.createBuffer({
      size, usage: GPUBufferUsage.COPY_DST | GPUBufferUsage.MAP_READ,
    });
    const enc = this.device.createCommandEncoder();
    enc.copyBufferToBuffer(arr.buffer, 0, staging, 0, size);
    this.device.queue.submit([enc.finish()]);
    await staging.mapAsync(GPUMapMode.READ);
    const [T] = STORAGE[arr.dtype];
    const out = new T(staging.getMappedRange().slice(0, nbytes));
    staging.unmap();
    staging.destroy();
    return out;
  }

  _pipeline(kernel) {
    let hit = this.pipelines.get(kernel.name);
    if (hit) return hit;
    const entries = kernel.bindings.map((b) => ({
      binding: b.binding, visibility: GPUShaderStage.COMPUTE,
      buffer: { type: b.access === "read" ? "read-only-storage" : "storage" },
    }));
    if (kernel.uniform_binding !== null) {
      entries.push({ binding: kernel.uniform_binding, visibility: GPUShaderStage.COMPUTE,
                     buffer: { type: "uniform" } });
    }
    const layout = this.device.createBindGroupLayout({ entries });
    const module = this.device.createShaderModule({ code: kernel.wgsl, label: kernel.name });
    const pipeline = this.device.createComputePipeline({
      layout: this.device.createPipelineLayout({ bindGroupLayouts: [layout] }),
      compute: { module, entryPoint: "main" },
    });
    hit = { pipeline, layout };
    this.pipelines.set(kernel.name, hit);
    return hit;
  }

  /** Check the arguments, run the host program, dispatch; resolves when the GPU is done. */
  async call(name, ...args) {
    const fn = this.functions[name];
    if (!fn) throw new Error(`module has no function ${name}`);
    if (args.length !== fn.params.length) {
      throw new Error(`${name} takes ${fn.params.length} arguments, got ${args.length}`);
    }
    const env = {};
    const refs = {};
    fn.params.forEach((p, i) => {
      const a = args[i];
      if (p.kind === "scalar") { env[p.name] = a; return; }
      if (a.dtype !== p.dtype) throw new Error(`${name}: argument ${p.name} has dtype ${a.dtype}, expected ${p.dtype}`);
      if (a.shape.length !== p.shape.length) throw new Error(`${name}: argument ${p.name} has rank ${a.shape.length}, expected ${p.shape.length}`);
      p.shape.forEach((d, k) => {
        if (Array.isArray(d) && d[0] === "var" && !(d[1] in env)) env[d[1]] = a.shape[k];
      });
      refs[`p${i}`] = [a.buffer, a.shape.reduce((x, y) => x * y, 1)];
    });
    fn.params.forEach((p, i) => {
      if (p.kind !== "buffer") return;
      p.shape.forEach((d, k) => {
        const want = evaluate(d, env);
        if (args[i].shape[k] !== want) {
          throw new Error(`${name}: argument ${p.name}: dimension ${k} has extent ${args[i].shape[k]}, expected ${want}`);
        }
      });
    });
    const enc = this.device.createCommandEncoder();
    const errors = [];
    const run = (node) => {
      switch (node[0]) {
        case "seq": node[1].forEach(run); break;
        case "let": env[node[1]] = evaluate(node[2], env); run(node[3]); break;
        case "assert": if (!evaluate(node[1], env)) throw new Error(`${name}: ${node[2]}`); run(node[3]); break;
        case "if": if (evaluate(node[1], env)) run(node[2]); else if (node[3]) run(node[3]); break;
        case "for": {
          const lo = evaluate(node[2], env);
          for (let i = lo; i < lo + evaluate(node[3], env); i++) { env[node[1]] = i; run(node[4]); }
          break;
        }
        case "alloc": {
          const n = Math.max(0, evaluate(node[3], env));
          refs[node[1]] = [this._buffer(n * STORAGE[node[2]][1]), n];
          run(node[4]);
          break;
        }
        case "launch": this._launch(fn.kernels[node[1]], env, refs, enc, errors); break;
        case "nop": break;
        default: throw new Error(`unknown host statement ${node[0]}`);
      }
    };
    run(fn.host);
    this.device.queue.submit([enc.finish()]);
    for (const [buf, messages] of errors) {
      const code = (await this.read({ buffer: buf, shape: [1], dtype: "int32" }))[0];
      if (code) throw new Error(`${name}: ${messages[code - 1] || `error code ${code}`}`);
    }
    await this.device.queue.onSubmittedWorkDone();
  }

  _launch(kernel, env, refs, enc, errors) {
    const { pipeline, layout } = this._pipeline(kernel);
    const bufferOf = (ref) => {
      if (!(ref in refs) && ref.startsWith("e")) {
        const buf = this._buffer(4);
        enc.clearBuffer(buf);
        errors.push([buf, kernel.error_messages]);
        refs[ref] = [buf, 1];
      }
      return refs[ref];
    };
    const entries = [];
    const offsets = {};
    const after = [];
    for (const b of kernel.bindings) {
      if (!b.packed) { entries.push({ binding: b.binding, resource: { buffer: bufferOf(b.buffers[0])[0] } }); continue; }
      let total = 0;
      const members = b.buffers.map((ref, j) => {
        const [buf, n] = bufferOf(ref);
        offsets[`${b.binding},${j}`] = total;
        total += n;
        return [buf, offsets[`${b.binding},${j}`], n];
      });
      const packed = this._buffer(total * 4);
      for (const [buf, off, n] of members) {
        if (!n) continue;
        enc.copyBufferToBuffer(buf, 0, packed, off * 4, n * 4);
        if (b.access === "read_write") after.push([packed, off * 4, buf, n * 4]);
      }
      entries.push({ binding: b.binding, resource: { buffer: packed } });
    }
    if (kernel.uniform_binding !== null) {
      const data = uniformBytes(kernel, env, offsets);
      const ubuf = this.device.createBuffer({
        size: data.byteLength, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
      });
      this.device.queue.writeBuffer(ubuf, 0, data);
      entries.push({ binding: kernel.uniform_binding, resource: { buffer: ubuf } });
    }
    const counts = dispatchCounts(kernel, env);
    if (counts) {
      const pass = enc.beginComputePass();
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, this.device.createBindGroup({ layout, entries }));
      pass.dispatchWorkgroups(...counts);
      pass.end();
    }
    for (const [src, so, dst, size] of after) enc.copyBufferToBuffer(src, so, dst, 0, size);
  }
}

/** Fetch an exported module and prepare it for `device`. */
export async function loadModule(url, device) {
  const meta = await (await fetch(url)).json();
  return new TilecraftModule(meta, device);
}

export { TilecraftModule };
