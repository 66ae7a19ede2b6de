#!/usr/bin/env node
// `componentize-js`, with the bindings it generates made cheaper to run in Berth's sandbox.
//
// Usage, as `componentize-js`'s (only these options):
//   node componentize.mjs <source.js> --wit <dir> --world-name <world> [--disable <feature>...] --out <file.wasm>
//
// ComponentizeJS writes, for every function of the world, JavaScript that copies arguments and
// results between the engine and the component's memory ("the bindings"), and SpiderMonkey runs it
// in its interpreter: in a Berth driver most of a call's instructions were the bindings', not the
// driver's (BENCHMARKS.md, "Drivers by language"). This script runs ComponentizeJS 0.23.0 as its
// command does and rewrites seven things in the bindings before they are compiled into the
// component, none of which changes what a driver sees:
//   1. a string is measured and encoded by the engine's own TextEncoder, not by a JavaScript loop
//      over its characters (the loop was most of a call: create-export 3.35 M instructions of which
//      1.74 M were this loop), and copied into the memory through one Uint8Array kept with the
//      DataView below, not a new view of each string's bytes (which throws past the memory's end
//      as that did);
//   2. one DataView of the memory serves every field read or written, made again only where the
//      memory can have grown under it: at an export's start (the host wrote its arguments), after
//      an allocation and after an import's call (the host wrote its result). `dataView($memory)`,
//      called at each of its 1,294 uses, was a function call and two property reads each time
//      (ComponentizeJS's memory buffer is an ArrayBuffer over the heap up to its break, made anew
//      when the break moves; one made before stays valid for what lay below the break, and a
//      place missed here would fail loudly, a RangeError past the view's end, not copy wrong bytes);
//   3. the `_debugLog(...)` calls go: each looked up `globalThis.process.env.JCO_DEBUG`, which a
//      component never has, after building the object it would have logged;
//   4. an export awaits what the driver's function returned only when it is a promise (an `await`
//      of a plain value still costs a trip through the job queue);
//   5. the standard classes the bindings use are resolved when the component is built: they live
//      in a global of their own, which the driver's own warm-up (top-level code) does not reach,
//      so every fresh instance resolved them again at its first call;
//   6. an export's bindings run as a generator, not as an `async` function, and return a promise
//      settled once when the component is built: the engine records where each promise it
//      settles was settled (a stack trace), and finding the line of a return at the end of
//      bindings some 500 lines long walked the function's line table from its start, at every
//      call (13 % of an attach's time in the driver). A driver function that returns a promise is
//      still awaited, and what it throws after an `await` is still its error;
//   7. the bindings run inside a function: their names (`dv`, `$memory`, the helpers, every
//      import's function), declared at a script's top level, were looked up by name in the
//      global's tables at each use; a function's own names are slots the interpreter reads
//      directly. Only what ComponentizeJS's runtime looks up (`bindExports` and the exports) is
//      put on the global.
// Together: js-iscsi's attach (three calls) 8.04 M instructions -> 1.91 M.
// Each rewrite must find what it rewrites: with another ComponentizeJS version the build fails,
// naming the rewrite, instead of shipping bindings half rewritten.

import { componentize } from '@bytecodealliance/componentize-js';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';

const TESTED_WITH = '0.23.0';

function parseArgs(argv) {
  const opts = { disable: [] };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${arg} needs a value`);
      return argv[++i];
    };
    if (arg === '--wit' || arg === '-w') opts.wit = value();
    else if (arg === '--world-name' || arg === '-n') opts.world = value();
    else if (arg === '--out' || arg === '-o') opts.out = value();
    else if (arg === '--disable' || arg === '-d') {
      while (i + 1 < argv.length && !argv[i + 1].startsWith('-')) opts.disable.push(argv[++i]);
    } else if (arg.startsWith('-')) throw new Error(`unknown option ${arg}`);
    else if (opts.source === undefined) opts.source = arg;
    else throw new Error(`unexpected argument ${arg}`);
  }
  for (const [key, name] of [['source', '<source.js>'], ['wit', '--wit'], ['out', '--out']]) {
    if (opts[key] === undefined) throw new Error(`${name} is required`);
  }
  return opts;
}

// Replaces every match of `pattern` with `replacement`; fails unless there is at least one.
function rewrite(bindings, what, pattern, replacement) {
  let count = 0;
  const out = bindings.replace(pattern, (...match) => {
    count += 1;
    return typeof replacement === 'function' ? replacement(...match) : replacement;
  });
  if (count === 0) {
    throw new Error(
      `componentize.mjs: the bindings have no ${what} to rewrite; ` +
        `this script was written for ComponentizeJS ${TESTED_WITH}`,
    );
  }
  return out;
}

const SYNC = 'dv = dataView($memory);';

// The views of the memory: a DataView for fields and a Uint8Array for strings, made again together
// when the memory's buffer is another.
const VIEWS = `let dv = new DataView(new ArrayBuffer());
let u8 = new Uint8Array(0);
const dataView = (mem) => {
  const buffer = mem.buffer;
  if (dv.buffer !== buffer) {
    dv = new DataView(buffer);
    u8 = new Uint8Array(buffer);
  }
  return dv;
};`;

const ENCODE = `function _utf8AllocateAndEncode(s, realloc, memory) {
  if (typeof s !== 'string') {
    throw new TypeError('expected a string, received [' + typeof s + ']');
  }
  if (s.length === 0) { return { ptr: 1, len: 0 }; }
  const bytes = TEXT_ENCODER_UTF8.encode(s);
  const len = bytes.length;
  const ptr = realloc(0, 0, 1, len);
  ${SYNC}
  u8.set(bytes, ptr);
  return { ptr, len };
}
`;

// An export as ComponentizeJS calls it: a function that returns a promise of its result. Its
// bindings run as a generator that yields only what the driver's function returned when that is
// a promise (or another thenable), so a driver that returns its result runs without any promise
// but the one settled here, and the promise of a result without a value is made once.
const RUN_EXPORT = `
const EXPORT_DONE = Promise.resolve();
function runExport(steps) {
  let step = steps.next();
  while (!step.done) {
    const value = step.value;
    if (value !== null && (typeof value === 'object' || typeof value === 'function') && typeof value.then === 'function') {
      return finishExport(steps, value);
    }
    step = steps.next(value);
  }
  return step.value === undefined ? EXPORT_DONE : Promise.resolve(step.value);
}
async function finishExport(steps, pending) {
  for (;;) {
    let value;
    let failed = false;
    try {
      value = await pending;
    } catch (e) {
      [value, failed] = [e, true];
    }
    const step = failed ? steps.throw(value) : steps.next(value);
    if (step.done) return step.value;
    pending = step.value;
  }
}
`;

// Run once when the component is built, in the bindings' own global.
const WARM_UP = `
{
  const bytes = new Uint8Array(16);
  const view = new DataView(bytes.buffer);
  view.setUint32(0, 1, true); view.getUint32(0, true); view.setInt8(0, 0, true); view.getUint8(0, true);
  view.setBigInt64(8, 1n, true); view.getBigInt64(8, true);
  BigInt.asUintN(64, BigInt(1)); BigInt.asIntN(64, 1n);
  bytes.set(TEXT_ENCODER_UTF8.encode('warm-up'));
  TEXT_DECODER_UTF8.decode(new Uint8Array(bytes.buffer, 0, 4));
  [1].push(2); Array(2).fill(0); new Map().set(1, 1);
  try { throw new ComponentError({ tag: 'warm-up' }); } catch (e) { getErrorPayload(e); }
  (async () => 1)();
}
`;

function tighten(bindings) {
  let b = bindings;
  const start = b.indexOf('function _utf8AllocateAndEncode(');
  const end = start < 0 ? -1 : b.indexOf('\n}\n', start);
  if (end < 0) {
    throw new Error(`componentize.mjs: no _utf8AllocateAndEncode in the bindings (written for ComponentizeJS ${TESTED_WITH})`);
  }
  b = b.slice(0, start) + ENCODE + b.slice(end + 3);
  b = rewrite(b, 'dataView($memory)', /dataView\(\$memory\)/g, 'dv');
  b = rewrite(
    b,
    'the memory view',
    /^let dv = new DataView\(new ArrayBuffer\(\)\);\nconst dataView = mem => dv\.buffer === mem\.buffer \? dv : dv = new DataView\(mem\.buffer\);$/m,
    VIEWS,
  );
  b = rewrite(b, 'exported functions', /(\nasync function export_[^\n]*\{\n)/g, (_, head) => `${head}  ${SYNC}\n`);
  b = rewrite(b, 'allocations and imports', /^(.*(?:\$realloc\(|\$import_[\w$]+\().*;)[ \t]*$/gm, (_, line) => `${line} ${SYNC}`);
  b = rewrite(b, '_debugLog calls', /_debugLog\('[^']*', \{[^}]*\}\);/g, '');
  b = b.replace(/_debugLog\('[^']*'\);/g, '');
  let awaited = 0;
  b = rewrite(b, 'awaited driver calls', /const (hostRet\d+) = await (\w+)\(/g, (_, ret, fn) => {
    awaited += 1;
    return `let ${ret} = ${fn}(`;
  });
  let guarded = 0;
  b = rewrite(b, 'driver results', /\n(\s*)ret = (hostRet\d+) !== null/g, (_, indent, ret) => {
    guarded += 1;
    return (
      `\n${indent}if (${ret} !== null && typeof ${ret} === 'object' && typeof ${ret}.then === 'function') ${ret} = await ${ret};` +
      `\n${indent}ret = ${ret} !== null`
    );
  });
  if (awaited !== guarded) {
    throw new Error(`componentize.mjs: ${awaited} driver calls but ${guarded} results (written for ComponentizeJS ${TESTED_WITH})`);
  }
  const exports = [];
  b = rewrite(b, 'exported async functions', /\nasync function (export_[\w$]+)\(([^)]*)\) \{\n([\s\S]*?)\n\}\n/g, (_, name, params, body) => {
    exports.push(name);
    if (/\basync\b/.test(body)) {
      throw new Error(`componentize.mjs: ${name} holds an async function (written for ComponentizeJS ${TESTED_WITH})`);
    }
    const steps = body.replace(/= await /g, '= yield ');
    if (/\bawait\b/.test(steps)) {
      throw new Error(`componentize.mjs: ${name} awaits other than a driver's result (written for ComponentizeJS ${TESTED_WITH})`);
    }
    return `\nfunction* ${name}$steps(${params}) {\n${steps}\n}\nfunction ${name}(${params}) { return runExport(${name}$steps(${params})); }\n`;
  });
  // A generator function's `prototype`, which each of its generators inherits from, is made at its
  // first call unless it exists: made here, once (and `runExport` run once, as the warm-up does).
  const prototypes = `\n${exports.map((name) => `${name}$steps.prototype;`).join('\n')}\nrunExport((function* () { yield 1; })());\n`;
  // The bindings in a function of their own; what ComponentizeJS's runtime looks up on the
  // global afterwards is put there.
  const globals = ['bindExports', ...exports].map((name) => `globalThis[${JSON.stringify(name)}] = ${name};`);
  return `(function () {\n${b}${RUN_EXPORT}${WARM_UP}${prototypes}\n${globals.join('\n')}\n})();\n`;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  // ComponentizeJS takes its bindings from this object; its `spliceBindings` is wrapped so that
  // what it returns is rewritten before anything is compiled.
  const componentizeUrl = import.meta.resolve('@bytecodealliance/componentize-js');
  const { splicer } = await import(new URL('../lib/spidermonkey-embedding-splicer.js', componentizeUrl));
  const splice = splicer.spliceBindings;
  splicer.spliceBindings = (...args) => {
    const spliced = splice(...args);
    spliced.jsBindings = tighten(spliced.jsBindings);
    return spliced;
  };
  const { component } = await componentize({
    sourcePath: opts.source,
    witPath: resolve(opts.wit),
    worldName: opts.world,
    disableFeatures: opts.disable,
  });
  await mkdir(dirname(resolve(opts.out)), { recursive: true });
  await writeFile(opts.out, component);
}

main().catch((e) => {
  console.error(e.message ?? e);
  process.exit(1);
});
