//! Commands: the one trampoline every command runs through, their registration, and what the
//! server learns about each (arity, flags, key spec, COMMAND DOCS, ACL categories).

use std::ffi::{c_int, CString};
use std::ptr;

use redis_module::{raw, Context, RedisResult, RedisString};

use super::guard::guard;

/// A command's handler. Implemented above this layer, one type per command.
pub trait Command: 'static {
    /// The name the panic guard reports (and the fault-injection tests arm), e.g.
    /// `LOCK.ACQUIRE`.
    const NAME: &'static str;
    fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult;
}

/// What Redis calls for a command.
pub type Handler = raw::RedisModuleCmdFunc;

/// The handler of `C`: runs it inside the panic guard and replies.
pub const fn handler<C: Command>() -> Handler {
    Some(trampoline::<C>)
}

extern "C" fn trampoline<C: Command>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let args = redis_module::decode_args(ctx, argv, argc);
    let reply = guard(C::NAME, || C::run(&context, args));
    context.reply(reply) as c_int
}

/// How a command's single key (argument 1) is used: for COMMAND INFO, ACL key patterns and
/// cluster routing. `None` for a command without a key (served by any node, per server).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyAccess {
    ReadOnly,
    ReadWrite,
    None,
}

/// The kind of one documented argument (a subset of Redis's argument types).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    /// The command's key; refers to key spec 0.
    Key,
    String,
    Integer,
    /// A keyword alone, such as `ALL`.
    PureToken,
}

/// One argument as COMMAND DOCS shows it.
#[derive(Debug)]
pub struct ArgDoc {
    pub name: &'static str,
    pub kind: ArgKind,
    /// The keyword that introduces the argument (`WAIT` in `[WAIT timeout]`).
    pub token: Option<&'static str>,
    pub optional: bool,
}

/// Everything registered for one command.
#[derive(Debug)]
pub struct CommandDoc {
    pub name: &'static str,
    /// Redis's arity: positive = exact argument count (command name included), negative = at
    /// least that many.
    pub arity: i32,
    /// Command flags for `RedisModule_CreateCommand`.
    pub flags: &'static str,
    pub access: KeyAccess,
    pub summary: &'static str,
    pub complexity: &'static str,
    /// The version the command was added in.
    pub since: &'static str,
    /// Standard ACL categories, set where the server supports categories for module commands
    /// (Redis 7.2+, Valkey 8+; on 7.0 module commands belong to none).
    pub acl_categories: &'static str,
    /// Also in the module's own category [`ACL_CATEGORY`].
    pub in_module_category: bool,
    pub args: &'static [ArgDoc],
}

/// Creates the command `doc` describes, with `handler`, then declares its documentation, key
/// spec and ACL categories (`module_category` too, where the server has one).
pub fn register(
    ctx: &Context,
    doc: &CommandDoc,
    handler: Handler,
    module_category: Option<&str>,
) -> Result<(), String> {
    let keys = if doc.access == KeyAccess::None {
        (0, 0, 0)
    } else {
        (1, 1, 1)
    };
    create(ctx, doc.name, doc.flags, handler, keys)?;
    set_command_info(ctx, doc, module_category)
}

/// Creates a command with no key and no documentation (the test-only hooks).
#[cfg(feature = "test-hooks")]
pub fn register_keyless(
    ctx: &Context,
    name: &str,
    flags: &str,
    handler: Handler,
) -> Result<(), String> {
    create(ctx, name, flags, handler, (0, 0, 0))
}

fn create(
    ctx: &Context,
    name: &str,
    flags: &str,
    handler: Handler,
    (first, last, step): (c_int, c_int, c_int),
) -> Result<(), String> {
    let cname = CString::new(name).map_err(|e| e.to_string())?;
    let cflags = CString::new(flags).map_err(|e| e.to_string())?;
    // SAFETY: ctx is OnLoad's; name and flags are NUL-terminated and Redis copies them; the
    // handler is a 'static function.
    let rc = unsafe {
        raw::RedisModule_CreateCommand.map_or(1, |f| {
            f(
                ctx.ctx,
                cname.as_ptr(),
                handler,
                cflags.as_ptr(),
                first,
                last,
                step,
            )
        })
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("cannot create the command {name}"))
    }
}

/// Declares a command's arity, its one key (argument 1), its documentation (summary,
/// complexity, since, arguments: what COMMAND DOCS shows) through RedisModule_SetCommandInfo,
/// which Redis 7.0 has even though the crate's proc macro needs 7.2; then its ACL categories
/// where the server has them (see [`add_module_acl_category`]).
fn set_command_info(
    ctx: &Context,
    doc: &CommandDoc,
    module_category: Option<&str>,
) -> Result<(), String> {
    let name = doc.name;
    let cname = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: ctx is OnLoad's; GetCommand returns NULL for an unknown name, checked below.
    let command = unsafe {
        raw::RedisModule_GetCommand.map_or(ptr::null_mut(), |f| f(ctx.ctx, cname.as_ptr()))
    };
    if command.is_null() {
        return Err(format!("command {name} not found"));
    }
    let flags = match doc.access {
        KeyAccess::None => 0,
        KeyAccess::ReadOnly => raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
        // INSERT, UPDATE and DELETE are exclusive in Redis; a lock command may do any of the
        // three, which is what UPDATE (the general one) says.
        KeyAccess::ReadWrite => {
            raw::REDISMODULE_CMD_KEY_RW
                | raw::REDISMODULE_CMD_KEY_ACCESS
                | raw::REDISMODULE_CMD_KEY_UPDATE
        }
    };
    // A zeroed spec is the array terminator Redis looks for.
    // SAFETY: RedisModuleCommandKeySpec is plain C data for which all-zero is valid.
    // A keyless command passes only the terminator.
    let mut specs: [raw::RedisModuleCommandKeySpec; 2] = unsafe { std::mem::zeroed() };
    if doc.access != KeyAccess::None {
        specs[0].flags = u64::from(flags);
        specs[0].begin_search_type =
            raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
        specs[0].bs.index = raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 1 };
        specs[0].find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
        specs[0].fk.range = raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
            lastkey: 0,
            keystep: 1,
            limit: 0,
        };
    }
    // Every string the structures point to lives in `strings` until after the call.
    let cstr = |s: &str| CString::new(s).map_err(|e| format!("{name}: {e}"));
    let summary = cstr(doc.summary)?;
    let complexity = cstr(doc.complexity)?;
    let since = cstr(doc.since)?;
    let mut strings: Vec<CString> = Vec::new();
    let mut args: Vec<raw::RedisModuleCommandArg> = Vec::with_capacity(doc.args.len() + 1);
    for a in doc.args {
        // SAFETY: plain C data for which all-zero is valid (NULL pointers, no flags).
        let mut arg: raw::RedisModuleCommandArg = unsafe { std::mem::zeroed() };
        let arg_name = cstr(a.name)?;
        arg.name = arg_name.as_ptr();
        strings.push(arg_name);
        (arg.type_, arg.key_spec_index) = match a.kind {
            ArgKind::Key => (raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY, 0),
            ArgKind::String => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
                -1,
            ),
            ArgKind::Integer => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
                -1,
            ),
            ArgKind::PureToken => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
                -1,
            ),
        };
        if let Some(token) = a.token {
            let token = cstr(token)?;
            arg.token = token.as_ptr();
            strings.push(token);
        }
        if a.optional {
            arg.flags = raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int;
        }
        args.push(arg);
    }
    // The zeroed terminator (name NULL).
    // SAFETY: as above.
    args.push(unsafe { std::mem::zeroed() });
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    let info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: summary.as_ptr(),
        complexity: complexity.as_ptr(),
        since: since.as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null(),
        arity: doc.arity,
        key_specs: specs.as_mut_ptr(),
        args: args.as_mut_ptr(),
    };
    // SAFETY: command is live; info and everything it points to (specs, args, the CStrings)
    // outlive the call, and Redis copies what it keeps (zstrdup / its own arrays).
    let rc = unsafe { raw::RedisModule_SetCommandInfo.map_or(1, |f| f(command, &info)) };
    drop(strings);
    if rc != 0 {
        return Err(format!("SetCommandInfo failed for {name}"));
    }
    set_acl_categories(command, doc, module_category)
}

/// Sets the command's ACL categories where the server supports them for module commands (Redis
/// 7.2+, Valkey 8+; looked up at load, since on 7.0 the function does not exist and module
/// commands belong to no category).
fn set_acl_categories(
    command: *mut raw::RedisModuleCommand,
    doc: &CommandDoc,
    module_category: Option<&str>,
) -> Result<(), String> {
    // SAFETY: reading a function pointer the API table filled in at load.
    let Some(set) = (unsafe { raw::RedisModule_SetCommandACLCategories }) else {
        return Ok(());
    };
    let categories = match module_category {
        Some(own) if doc.in_module_category => format!("{} {own}", doc.acl_categories),
        _ => doc.acl_categories.to_string(),
    };
    let c = CString::new(categories.as_str()).map_err(|e| e.to_string())?;
    // SAFETY: command is a live handle from GetCommand during OnLoad; c outlives the call and
    // Redis parses it into flags without keeping the pointer.
    if unsafe { set(command, c.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(format!(
            "cannot set ACL categories '{categories}' on {}",
            doc.name
        ))
    }
}

/// Adds the module's own ACL category where the server can (Redis 7.4+, Valkey 8+). Returns
/// whether the category exists now; an older server simply has none.
pub fn add_module_acl_category(ctx: &Context, name: &str) -> Result<bool, String> {
    // SAFETY: reading a function pointer the API table filled in at load.
    let Some(add) = (unsafe { raw::RedisModule_AddACLCategory }) else {
        return Ok(false);
    };
    let c = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: ctx is OnLoad's (the only time Redis accepts new categories); c outlives the call
    // and Redis copies the name.
    if unsafe { add(ctx.ctx, c.as_ptr()) } == 0 {
        Ok(true)
    } else {
        Err(format!("cannot add the ACL category '{name}'"))
    }
}
