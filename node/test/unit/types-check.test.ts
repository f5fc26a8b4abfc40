// Type-level check: every client kind the package takes is a RedisClientLike (compiles or not).
import { it } from "node:test";
import assert from "node:assert/strict";
import type { Redis, Cluster } from "ioredis";
import type { createClient } from "redis";
import type { RedisClientLike } from "../../src/settings.js";

type NodeRedis5 = ReturnType<typeof createClient>;
type NodeRedis4 = ReturnType<typeof import("redis4").createClient>;
type NodeRedis6 = ReturnType<typeof import("redis6").createClient>;
type Ioredis6 = import("ioredis6").Redis;
type Ioredis6Cluster = import("ioredis6").Cluster;
const ok: [Redis, Cluster, NodeRedis5, NodeRedis4] extends [RedisClientLike, RedisClientLike, RedisClientLike, RedisClientLike] ? true : false = true;
const ok6: [Ioredis6, Ioredis6Cluster, NodeRedis6] extends [RedisClientLike, RedisClientLike, RedisClientLike] ? true : false = true;

it("ioredis 5/6 Redis and Cluster and node-redis v4/v5/v6 clients are RedisClientLike", () => {
  assert.equal(ok6, true);
  assert.equal(ok, true);
});
