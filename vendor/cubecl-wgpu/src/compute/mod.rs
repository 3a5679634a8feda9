pub(crate) mod controller;

mod storage;

pub(super) mod mem_manager;
pub(super) mod poll;
pub(super) mod schedule;
mod server;
pub(super) mod stream;
// Kiln patch: the wait spin setting.
pub use stream::{set_wait_spin_us, wait_spin_us, DEFAULT_WAIT_SPIN_US};
pub(super) mod timings;

pub use server::*;
pub use storage::*;
