'use strict';
/*
 * A simulator written in Node.js behind rlfleet's EnvService (proto/rlfleet/v1/env.proto), to show
 * that any language can feed the fleet: `rlfleet train ... env.name=remote://127.0.0.1:PORT`.
 *
 * Task "reach2d": a point in the square [-1, 1]^2 must reach a goal. State (4 float32): the point
 * (x, y) and the offset to the goal (gx - x, gy - y). Action (2 floats, clipped to [-1, 1]): a
 * velocity; the point moves by STEP * action and stays in the square. Reward: minus the distance
 * to the goal after the move (dense). An episode terminates with success within SUCCESS_RADIUS of
 * the goal and is truncated after --max-episode-steps steps. Start and goal are uniform in the
 * square, drawn from the env's own seeded generator (reproducible from Reset's seeds).
 *
 * The .proto files are loaded at runtime with @grpc/proto-loader; tensors travel as raw
 * little-endian bytes with their dtype and shape (proto/rlfleet/v1/tensor.proto).
 *
 *   node server.js [--host 127.0.0.1] [--port 0] [--address-file F] [--max-episode-steps 50]
 *                  [--num-envs 1] [--max-envs 256] [--proto-dir ../../proto]
 */
const fs = require('fs');
const os = require('os');
const path = require('path');
const { parseArgs } = require('util');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { HealthImplementation } = require('grpc-health-check');

const TASK = 'reach2d';
const DESCRIPTION = 'move the point to the goal';
const STATE_DIM = 4;
const ACTION_DIM = 2;
const STEP = 0.1;
const SUCCESS_RADIUS = 0.15;
const SCHEMA_VERSION = 1; // TensorMap.schema_version this server speaks
const SERVICE = 'rlfleet.v1.EnvService';

class RequestError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

const invalid = (msg) => new RequestError(grpc.status.INVALID_ARGUMENT, msg);
const precondition = (msg) => new RequestError(grpc.status.FAILED_PRECONDITION, msg);

// --- random numbers: mulberry32, seeded from 64-bit seeds folded to 32 bits ---------------------

function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function fold64(value) {
  const v = BigInt.asUintN(64, BigInt(value));
  return Number((v ^ (v >> 32n)) & 0xffffffffn);
}

function mix(a, b) {
  // a 32-bit hash of two ints (the session seed and an env's global index)
  let h = Math.imul(a ^ 0x9e3779b9, 0x85ebca6b) ^ b;
  h = Math.imul(h ^ (h >>> 16), 0x7feb352d);
  h = Math.imul(h ^ (h >>> 15), 0x846ca68b);
  return (h ^ (h >>> 16)) >>> 0;
}

// --- the simulator -------------------------------------------------------------------------------

class PointEnv {
  constructor(rngSeed) {
    this.rng = mulberry32(rngSeed);
    this.point = [0, 0];
    this.goal = [0, 0];
    this.episodeReturn = 0;
    this.episodeLength = 0;
  }

  reseed(seed) {
    this.rng = mulberry32(mix(seed, 0x2545f491)); // hashed: nearby seeds give unrelated episodes
  }

  reset() {
    this.point = [2 * this.rng() - 1, 2 * this.rng() - 1];
    this.goal = [2 * this.rng() - 1, 2 * this.rng() - 1];
    this.episodeReturn = 0;
    this.episodeLength = 0;
  }

  // What the policy sees: the point and the offset to the goal (the goal itself is point + offset).
  observation() {
    const [x, y] = this.point;
    return [x, y, this.goal[0] - x, this.goal[1] - y];
  }

  distance() {
    return Math.hypot(this.goal[0] - this.point[0], this.goal[1] - this.point[1]);
  }

  step(ax, ay) {
    const clip = (v) => Math.max(-1, Math.min(1, v));
    this.point = [clip(this.point[0] + STEP * clip(ax)), clip(this.point[1] + STEP * clip(ay))];
    const dist = this.distance();
    const success = dist < SUCCESS_RADIUS;
    const reward = Math.fround(-dist);
    this.episodeReturn += reward;
    this.episodeLength += 1;
    return { reward, success };
  }
}

// A batch of envs for one client session, stepped K actions at a time with auto-reset
// (the semantics of rlfleet.envs.api).
class Session {
  constructor({ numEnvs, envOffset, seed, chunkSize, maxEpisodeSteps }) {
    this.numEnvs = numEnvs;
    this.chunkSize = chunkSize;
    this.maxEpisodeSteps = maxEpisodeSteps;
    this.key = Session.key({ numEnvs, envOffset, seed, chunkSize });
    const base = fold64(seed);
    this.envs = Array.from({ length: numEnvs }, (_, i) => new PointEnv(mix(base, envOffset + i)));
    this.wasReset = false;
    this.lastUsed = Date.now();
  }

  static key({ numEnvs, envOffset, seed, chunkSize }) {
    return `${numEnvs}/${envOffset}/${seed}/${chunkSize}`;
  }

  reset(seeds) {
    this.envs.forEach((env, i) => {
      if (seeds) env.reseed(fold64(seeds[i]));
      env.reset();
    });
    this.wasReset = true;
    return this.obs();
  }

  chunkStep(actions) {
    const B = this.numEnvs, K = this.chunkSize;
    const rewards = new Float32Array(B * K);
    const terminated = new Uint8Array(B), truncated = new Uint8Array(B), success = new Uint8Array(B);
    const done = new Uint8Array(B), epReturn = new Float32Array(B), epLength = new Int32Array(B);
    const finalStates = new Float32Array(B * STATE_DIM);
    this.envs.forEach((env, i) => {
      for (let k = 0; k < K; k++) {
        const a = (i * K + k) * ACTION_DIM;
        const r = env.step(actions[a], actions[a + 1]);
        rewards[i * K + k] = r.reward;
        if (r.success) success[i] = terminated[i] = 1;
        else if (env.episodeLength >= this.maxEpisodeSteps) truncated[i] = 1;
        if (terminated[i] || truncated[i]) {
          done[i] = 1;
          epReturn[i] = env.episodeReturn;
          epLength[i] = env.episodeLength;
          finalStates.set(env.observation(), i * STATE_DIM);
          env.reset(); // auto-reset: the rest of the chunk is skipped, obs is the new episode's first
          break;
        }
      }
    });
    const step = tensorMap([
      tensor('rewards', 'float32', [B, K], rewards),
      tensor('terminated', 'bool', [B], terminated),
      tensor('truncated', 'bool', [B], truncated),
      tensor('success', 'bool', [B], success),
      tensor('episode_done', 'bool', [B], done),
      tensor('episode_return', 'float32', [B], epReturn),
      tensor('episode_length', 'int32', [B], epLength),
      tensor('episode_success_once', 'bool', [B], terminated), // episodes end on their first success
      tensor('final_states', 'float32', [B, STATE_DIM], finalStates),
    ]);
    return { obs: this.obs(), step };
  }

  // `states` is all rlfleet needs; it derives `instructions` and `task_ids` from the spec and
  // the task descriptions.
  obs() {
    const states = new Float32Array(this.numEnvs * STATE_DIM);
    this.envs.forEach((env, i) => states.set(env.observation(), i * STATE_DIM));
    return tensorMap([tensor('states', 'float32', [this.numEnvs, STATE_DIM], states)],
      { task_descriptions: Array(this.numEnvs).fill(DESCRIPTION) });
  }
}

// --- tensors on the wire -----------------------------------------------------------------------

function tensor(name, dtype, shape, typed) {
  return { name, dtype, shape, data: Buffer.from(typed.buffer, typed.byteOffset, typed.byteLength) };
}

function tensorMap(tensors, strings = {}) {
  const out = {};
  for (const [key, values] of Object.entries(strings)) out[key] = { values };
  return { tensors, strings: out, schema_version: SCHEMA_VERSION };
}

function decodeActions(msg, B, K) {
  if (!msg) throw invalid('ChunkStep needs an `actions` tensor');
  const want = [B, K, ACTION_DIM];
  const shape = (msg.shape || []).map(Number);
  if (msg.dtype !== 'float32') throw invalid(`tensor 'actions': dtype ${msg.dtype || '(none)'}, expected float32`);
  if (shape.length !== 3 || shape.some((d, i) => d !== want[i])) {
    throw invalid(`tensor 'actions': shape [${shape}], expected [${want}]`);
  }
  const n = B * K * ACTION_DIM;
  if (msg.data.length !== n * 4) throw invalid(`tensor 'actions': ${msg.data.length} bytes, expected ${n * 4}`);
  const actions = new Float32Array(new Uint8Array(msg.data).buffer); // copy: aligned for Float32Array
  if (!actions.every(Number.isFinite)) throw invalid("tensor 'actions' contains NaN or inf");
  return actions;
}

// --- the service -------------------------------------------------------------------------------

class EnvService {
  constructor({ maxEpisodeSteps, numEnvs, maxEnvs, idleMs = 600000 }) {
    Object.assign(this, { maxEpisodeSteps, numEnvs, maxEnvs, idleMs });
    this.sessions = new Map();
    this.rejected = 0;
  }

  handlers() {
    const wrap = (fn) => (call, callback) => {
      try {
        callback(null, fn.call(this, call.request));
      } catch (err) {
        this.rejected += 1;
        const code = err instanceof RequestError ? err.code : grpc.status.INTERNAL;
        if (!(err instanceof RequestError)) console.error(err);
        callback({ code, details: err.message });
      }
    };
    return {
      GetSpec: wrap(this.getSpec), Reset: wrap(this.reset), ChunkStep: wrap(this.chunkStep), Close: wrap(this.close),
    };
  }

  getSpec(req) {
    const numEnvs = req.num_envs || this.numEnvs, chunkSize = req.chunk_size || 1;
    if (numEnvs < 1 || chunkSize < 1 || req.env_offset < 0) {
      throw invalid(`num_envs and chunk_size must be >= 0 and env_offset >= 0, got ${req.num_envs}, ${req.chunk_size}, ${req.env_offset}`);
    }
    const settings = { numEnvs, envOffset: req.env_offset, seed: req.seed, chunkSize, maxEpisodeSteps: this.maxEpisodeSteps };
    let session = this.sessions.get(req.session_id);
    if (!session || session.key !== Session.key(settings)) { // new, or re-opened with other settings
      this.makeRoom(numEnvs, req.session_id);
      session = new Session(settings);
      this.sessions.set(req.session_id, session);
    }
    session.lastUsed = Date.now();
    return {
      num_envs: numEnvs, state_dim: STATE_DIM, action_dim: ACTION_DIM, chunk_size: chunkSize,
      max_episode_steps: this.maxEpisodeSteps, task_names: Array(numEnvs).fill(TASK), action_low: -1, action_high: 1,
      task_list: [TASK], observations: [{ key: 'states', dtype: 'float32', shape: [STATE_DIM] }], env_name: 'node-reach2d',
    };
  }

  makeRoom(numEnvs, replacing) {
    const inUse = () => [...this.sessions].reduce((n, [id, s]) => n + (id === replacing ? 0 : s.numEnvs), 0);
    const now = Date.now();
    for (const [id, s] of [...this.sessions].sort((a, b) => a[1].lastUsed - b[1].lastUsed)) {
      if (inUse() + numEnvs <= this.maxEnvs) return;
      if (id !== replacing && now - s.lastUsed > this.idleMs) this.sessions.delete(id);
    }
    if (inUse() + numEnvs > this.maxEnvs) {
      throw new RequestError(grpc.status.RESOURCE_EXHAUSTED,
        `${numEnvs} more envs would exceed this server's limit of ${this.maxEnvs} (${inUse()} in use)`);
    }
  }

  session(id) {
    const session = this.sessions.get(id);
    if (!session) throw precondition(`no open session '${id}': call GetSpec with this session_id first`);
    session.lastUsed = Date.now();
    return session;
  }

  reset(req) {
    const session = this.session(req.session_id);
    const seeds = req.seeds || [];
    if (seeds.length && seeds.length !== session.numEnvs) {
      throw invalid(`got ${seeds.length} seeds for a session of ${session.numEnvs} envs (send ${session.numEnvs}, or none)`);
    }
    return { obs: session.reset(seeds.length ? seeds : null) };
  }

  chunkStep(req) {
    const session = this.session(req.session_id);
    const actions = decodeActions(req.actions, session.numEnvs, session.chunkSize);
    if (!session.wasReset) throw precondition(`session '${req.session_id}': call Reset before ChunkStep`);
    // step_seq (env.proto): a repeat of the last number is answered again without stepping twice
    // (a client retrying a call that timed out); any other number but last + 1 means a lost step
    const seq = BigInt(req.step_seq || '0');
    const last = session.lastSeq || 0n;
    if (seq !== 0n && seq === last && session.lastReply) return session.lastReply;
    if (seq !== 0n && seq !== last + 1n) {
      throw precondition(`session '${req.session_id}': step_seq ${seq}, expected ${last + 1n} (a ChunkStep was lost or repeated)`);
    }
    const reply = { ...session.chunkStep(actions), step_seq: seq.toString() };
    if (seq !== 0n) {
      session.lastSeq = seq;
      session.lastReply = reply;
    }
    return reply;
  }

  close(req) {
    this.sessions.delete(req.session_id);
    return {};
  }
}

// --- start-up ----------------------------------------------------------------------------------

function parseOptions() {
  const { values } = parseArgs({
    options: {
      host: { type: 'string', default: '127.0.0.1' },
      port: { type: 'string', default: '0' },
      'address-file': { type: 'string' },
      'max-episode-steps': { type: 'string', default: '50' },
      'num-envs': { type: 'string', default: '1' },
      'max-envs': { type: 'string', default: '256' },
      'proto-dir': { type: 'string', default: path.resolve(__dirname, '..', '..', 'proto') },
    },
  });
  const int = (name) => {
    const v = Number(values[name]);
    if (!Number.isInteger(v) || v < 0) throw new Error(`--${name} must be a non-negative integer, got ${values[name]}`);
    return v;
  };
  if (!['127.0.0.1', 'localhost', '::1'].includes(values.host)) {
    throw new Error(`refusing to bind ${values.host}: this example has no authentication, so it serves loopback only`);
  }
  return {
    host: values.host, port: int('port'), addressFile: values['address-file'], protoDir: values['proto-dir'],
    maxEpisodeSteps: Math.max(1, int('max-episode-steps')), numEnvs: Math.max(1, int('num-envs')), maxEnvs: int('max-envs'),
  };
}

function main() {
  if (os.endianness() !== 'LE') throw new Error('tensors are little endian; this host is not');
  const opts = parseOptions();
  const definition = protoLoader.loadSync('rlfleet/v1/env.proto', {
    includeDirs: [opts.protoDir], keepCase: true, longs: String, enums: String, defaults: true,
  });
  const proto = grpc.loadPackageDefinition(definition);
  const service = new EnvService(opts);
  const server = new grpc.Server({ 'grpc.max_receive_message_length': 64 * 1024 * 1024 });
  server.addService(proto.rlfleet.v1.EnvService.service, service.handlers());
  new HealthImplementation({ '': 'SERVING', [SERVICE]: 'SERVING' }).addToServer(server);
  server.bindAsync(`${opts.host}:${opts.port}`, grpc.ServerCredentials.createInsecure(), (err, port) => {
    if (err) {
      console.error(`could not bind ${opts.host}:${opts.port}: ${err.message}`);
      process.exit(1);
    }
    const address = `${opts.host.includes(':') ? `[${opts.host}]` : opts.host}:${port}`;
    if (opts.addressFile) { // atomically, so a watcher never reads half a file
      fs.writeFileSync(`${opts.addressFile}.tmp`, JSON.stringify({ env: address }));
      fs.renameSync(`${opts.addressFile}.tmp`, opts.addressFile);
    }
    console.error(`EnvService (${TASK}) on ${address}: use env.name=remote://${address}`);
  });
  const stop = () => {
    console.error(`stopping: ${service.sessions.size} open sessions, ${service.rejected} rejected calls`);
    server.tryShutdown(() => process.exit(0));
    setTimeout(() => process.exit(0), 2000).unref();
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}

if (require.main === module) {
  try {
    main();
  } catch (err) {
    console.error(err.message);
    process.exit(2);
  }
}

module.exports = { EnvService, Session, PointEnv };
