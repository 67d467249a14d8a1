// jit.js - a JIT-heavy Node.js script for the census: for SECONDS it makes
// thousands of distinct functions (new Function, each its own shape of
// code), calls each hot enough for V8 to optimise it, and allocates objects
// of many shapes, so code space and the heap keep growing and being
// collected.  It prints how many functions it compiled.
//
//   node jit.js SECONDS
const end = Date.now() + parseFloat(process.argv[2]) * 1000;
let made = 0, sink = 0;
while (Date.now() < end) {
  const k = made++ % 5000;
  const f = new Function("a", "b",
    `let s = ${k}; for (let i = 0; i < a.length; i++) s += a[i] * ${k % 7 + 1} ^ (b + i);` +
    ` return {v${k}: s, w: [s, ${k}], k: ${k}};`);
  const arr = Array.from({ length: 64 }, (_, i) => i + k);
  for (let i = 0; i < 2000; i++) sink += f(arr, i).w[0] & 1;
}
console.log(`functions=${made} sink=${sink}`);
