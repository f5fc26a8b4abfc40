/* A helper module for tests/module_calls.rs: CALLHELPER.CALL cmd [arg ...] runs the command
 * through RedisModule_Call, as another module would (a temporary client that has no user of
 * its own), and replies with what it got. */
#include "redismodule.h"

static int call_command(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc < 2) return RedisModule_WrongArity(ctx);
    const char *cmd = RedisModule_StringPtrLen(argv[1], NULL);
    RedisModuleCallReply *reply = RedisModule_Call(ctx, cmd, "v", argv + 2, (size_t)(argc - 2));
    if (reply == NULL) return RedisModule_ReplyWithError(ctx, "ERR the call failed");
    RedisModule_ReplyWithCallReply(ctx, reply);
    RedisModule_FreeCallReply(reply);
    return REDISMODULE_OK;
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (RedisModule_Init(ctx, "callhelper", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    return RedisModule_CreateCommand(ctx, "callhelper.call", call_command, "", 0, 0, 0);
}
