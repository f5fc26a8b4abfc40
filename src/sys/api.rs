//! The module API functions this crate calls, checked once at load: a server that lacks one
//! refuses the module with a log line naming it, instead of the call silently doing nothing
//! later (a missing clock would read 0, a missing UnblockClient would leave a client blocked).
//! Functions that exist only on newer servers (ACL categories) are optional and looked up
//! where they are used.

use redis_module::raw;

/// Names of required API functions that the server did not provide.
pub fn missing() -> Vec<&'static str> {
    // SAFETY: each entry copies a function pointer (the braces read the static by value, no
    // reference is made) that the API table filled in at load, before OnLoad's body runs;
    // nothing writes them afterwards.
    let present: [(&'static str, bool); 55] = unsafe {
        [
            ("Milliseconds", { raw::RedisModule_Milliseconds }.is_some()),
            (
                "GetContextFlags",
                { raw::RedisModule_GetContextFlags }.is_some(),
            ),
            (
                "AvoidReplicaTraffic",
                { raw::RedisModule_AvoidReplicaTraffic }.is_some(),
            ),
            (
                "GetSelectedDb",
                { raw::RedisModule_GetSelectedDb }.is_some(),
            ),
            ("SelectDb", { raw::RedisModule_SelectDb }.is_some()),
            ("OpenKey", { raw::RedisModule_OpenKey }.is_some()),
            ("CloseKey", { raw::RedisModule_CloseKey }.is_some()),
            ("KeyType", { raw::RedisModule_KeyType }.is_some()),
            (
                "ModuleTypeGetType",
                { raw::RedisModule_ModuleTypeGetType }.is_some(),
            ),
            (
                "ModuleTypeGetValue",
                { raw::RedisModule_ModuleTypeGetValue }.is_some(),
            ),
            (
                "ModuleTypeSetValue",
                { raw::RedisModule_ModuleTypeSetValue }.is_some(),
            ),
            ("DeleteKey", { raw::RedisModule_DeleteKey }.is_some()),
            ("SetAbsExpire", { raw::RedisModule_SetAbsExpire }.is_some()),
            ("BlockClient", { raw::RedisModule_BlockClient }.is_some()),
            (
                "UnblockClient",
                { raw::RedisModule_UnblockClient }.is_some(),
            ),
            (
                "SetDisconnectCallback",
                { raw::RedisModule_SetDisconnectCallback }.is_some(),
            ),
            (
                "GetBlockedClientHandle",
                { raw::RedisModule_GetBlockedClientHandle }.is_some(),
            ),
            ("GetClientId", { raw::RedisModule_GetClientId }.is_some()),
            (
                "GetDetachedThreadSafeContext",
                { raw::RedisModule_GetDetachedThreadSafeContext }.is_some(),
            ),
            ("GetCommand", { raw::RedisModule_GetCommand }.is_some()),
            (
                "CreateCommand",
                { raw::RedisModule_CreateCommand }.is_some(),
            ),
            (
                "SetCommandInfo",
                { raw::RedisModule_SetCommandInfo }.is_some(),
            ),
            ("StringPtrLen", { raw::RedisModule_StringPtrLen }.is_some()),
            (
                "GetKeyNameFromIO",
                { raw::RedisModule_GetKeyNameFromIO }.is_some(),
            ),
            (
                "GetDbIdFromIO",
                { raw::RedisModule_GetDbIdFromIO }.is_some(),
            ),
            (
                "GetDbIdFromOptCtx",
                { raw::RedisModule_GetDbIdFromOptCtx }.is_some(),
            ),
            (
                "GetKeyNameFromOptCtx",
                { raw::RedisModule_GetKeyNameFromOptCtx }.is_some(),
            ),
            (
                "DigestAddStringBuffer",
                { raw::RedisModule_DigestAddStringBuffer }.is_some(),
            ),
            (
                "DigestAddLongLong",
                { raw::RedisModule_DigestAddLongLong }.is_some(),
            ),
            (
                "DigestEndSequence",
                { raw::RedisModule_DigestEndSequence }.is_some(),
            ),
            (
                "SubscribeToServerEvent",
                { raw::RedisModule_SubscribeToServerEvent }.is_some(),
            ),
            (
                "SubscribeToKeyspaceEvents",
                { raw::RedisModule_SubscribeToKeyspaceEvents }.is_some(),
            ),
            (
                "EventLoopAddOneShot",
                { raw::RedisModule_EventLoopAddOneShot }.is_some(),
            ),
            (
                "ScanCursorCreate",
                { raw::RedisModule_ScanCursorCreate }.is_some(),
            ),
            ("Scan", { raw::RedisModule_Scan }.is_some()),
            (
                "InfoAddSection",
                { raw::RedisModule_InfoAddSection }.is_some(),
            ),
            (
                "InfoAddFieldULongLong",
                { raw::RedisModule_InfoAddFieldULongLong }.is_some(),
            ),
            ("Replicate", { raw::RedisModule_Replicate }.is_some()),
            ("EmitAOF", { raw::RedisModule_EmitAOF }.is_some()),
            ("SaveUnsigned", { raw::RedisModule_SaveUnsigned }.is_some()),
            ("LoadUnsigned", { raw::RedisModule_LoadUnsigned }.is_some()),
            (
                "SaveStringBuffer",
                { raw::RedisModule_SaveStringBuffer }.is_some(),
            ),
            (
                "LoadStringBuffer",
                { raw::RedisModule_LoadStringBuffer }.is_some(),
            ),
            (
                "NotifyKeyspaceEvent",
                { raw::RedisModule_NotifyKeyspaceEvent }.is_some(),
            ),
            (
                "ScanCursorDestroy",
                { raw::RedisModule_ScanCursorDestroy }.is_some(),
            ),
            (
                "RegisterInfoFunc",
                { raw::RedisModule_RegisterInfoFunc }.is_some(),
            ),
            ("Alloc", { raw::RedisModule_Alloc }.is_some()),
            // The calling user's key permissions (sys::acl): Redis 7.0+, Valkey 8+.
            (
                "GetClientUserNameById",
                { raw::RedisModule_GetClientUserNameById }.is_some(),
            ),
            (
                "GetModuleUserFromUserName",
                { raw::RedisModule_GetModuleUserFromUserName }.is_some(),
            ),
            (
                "FreeModuleUser",
                { raw::RedisModule_FreeModuleUser }.is_some(),
            ),
            (
                "ACLCheckKeyPermissions",
                { raw::RedisModule_ACLCheckKeyPermissions }.is_some(),
            ),
            // Active defragmentation of lock values (sys::defrag): Redis 6.0+, Valkey 8+.
            ("DefragAlloc", { raw::RedisModule_DefragAlloc }.is_some()),
            (
                "DefragShouldStop",
                { raw::RedisModule_DefragShouldStop }.is_some(),
            ),
            ("CreateString", { raw::RedisModule_CreateString }.is_some()),
            ("FreeString", { raw::RedisModule_FreeString }.is_some()),
        ]
    };
    present
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(name, _)| name)
        .collect()
}

/// Fails when a required function is missing (called first thing in OnLoad).
pub fn check() -> Result<(), String> {
    let missing = missing();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "this server lacks module API functions the module needs: {}",
            missing.join(", ")
        ))
    }
}
