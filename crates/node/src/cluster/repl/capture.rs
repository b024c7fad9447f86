//! The positions a request's writes took in the targets' backlogs, recorded on the
//! request's thread while it runs (a `sync` reply waits for them, see [`super::wait`]).

use std::cell::RefCell;

use super::Positions;

/// What a request's mutations produced: backlog positions to wait for, and whether one of
/// them fell outside this cell's master range (the map moved between routing and
/// execution: the write is not replicated and must not be acknowledged).
#[derive(Default)]
pub struct Captured {
    pub positions: Positions,
    pub stray: bool,
    /// The request changed the store (whether or not the change is replicated).
    pub mutated: bool,
}

thread_local! {
    static CAPTURE: RefCell<Option<Captured>> = const { RefCell::new(None) };
}

/// Runs `f` recording the backlog positions of the mutations it makes.
pub fn capture<R>(f: impl FnOnce() -> R) -> (R, Captured) {
    CAPTURE.with(|c| *c.borrow_mut() = Some(Captured::default()));
    let r = f();
    let captured = CAPTURE.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (r, captured)
}

/// Runs `f` on the calling thread's capture, if a request installed one.
pub(super) fn with_capture(f: impl FnOnce(&mut Captured)) {
    CAPTURE.with(|c| {
        if let Some(v) = c.borrow_mut().as_mut() {
            f(v);
        }
    });
}
