// The driver layer's public face for the rest of the package: the connection interfaces and
// error classes (types.ts) and the entry points that pick an adapter for a user's client.
export * from "./types.js";
export { targetFor, sendRouted, sendWaitRouted, type WaitResult } from "./target.js";
export { withDeadline } from "./common.js";
