//! Waits that end on time: a waiter whose WAIT timeout passes gets its nil within a few
//! milliseconds of its deadline, whatever `hz` is.
//!
//! Redis answers a blocked client's timeout in the work it does before its event loop sleeps,
//! and with nothing else happening the loop sleeps until its next cron tick: up to 1/hz late
//! (100 ms at the default hz 10, a second at hz 1). So one module timer is kept armed for the
//! earliest deadline of the queued waiters (the registry keeps them in order, `by_deadline`);
//! it wakes the loop, and Redis answers the timeouts that passed on that turn. When it fires it
//! arms itself for the next deadline not yet passed.
//!
//! What it costs: nothing on the common path (an acquire that is granted or refused at once
//! never blocks); a waiter with a timeout adds one ordered insert and removal, and arms the
//! timer only when its deadline is the earliest. A waiter that leaves before its deadline
//! leaves the timer as it is: it fires for nothing once, and re-arms for the next deadline.

use std::time::Duration;

use redis_lock_core::{Millis, WaiterId};
use redis_module::Context;

use crate::state;
use crate::sys::context;

/// The longest a wake-up timer is armed for (see `timers::MAX_TIMER_DELAY`): a later deadline
/// gets a timer that fires early, finds it still ahead and re-arms.
const MAX_DELAY: Millis = 1 << 30;

/// A waiter was queued with `deadline` (module clock, ms; 0 = no timeout): makes sure the
/// event loop wakes for it.
pub fn on_block(ctx: &Context, deadline: Millis) {
    if deadline == 0 {
        return;
    }
    let at = wake_at(deadline);
    if let Some((id, armed)) = state::wake() {
        if armed <= at {
            return;
        }
        // The timer data is what `arm` gave it; a timer that already fired is gone.
        let _ = ctx.stop_timer::<Millis>(id);
        state::replace_wake(None);
    }
    arm(ctx, at);
}

/// When to wake for `deadline`: Redis times a client out once its clock (the module's, in
/// whole ms) is past the deadline, so one millisecond after it.
fn wake_at(deadline: Millis) -> Millis {
    deadline.saturating_add(1)
}

fn arm(ctx: &Context, at: Millis) {
    let delay = at.saturating_sub(context::now_ms()).min(MAX_DELAY);
    let id = ctx.create_timer(Duration::from_millis(delay), fire, at);
    state::replace_wake(Some((id, at)));
}

/// The wake-up timer fired: the deadlines up to now are answered by Redis on this turn of the
/// event loop; the timer is armed for the next one.
fn fire(ctx: &Context, at: Millis) {
    crate::sys::guard::guard_silent("deadline timer", || {
        match state::wake() {
            Some((_, armed)) if armed == at => {}
            // Not the armed one (stopped timers never fire; this is only a guard).
            _ => return,
        }
        state::replace_wake(None);
        let now = context::now_ms();
        let next = state::with_waiters(|r| {
            r.by_deadline
                .range((now, WaiterId(0))..)
                .next()
                .map(|(deadline, _)| *deadline)
        });
        if let Some(deadline) = next {
            arm(ctx, wake_at(deadline));
        }
    });
}
