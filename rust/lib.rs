//! shellseam's process core: module wiring only. The pure core (spawn, pipes, supervisor,
//! lifecycle, process, notifier, collector, spill, env, kill, landlock) builds and tests without Python; the bindings
//! are behind the `python` feature that maturin enables.

mod adopted;
pub mod cgroup;
mod child;
pub mod clone;
pub mod collector;
pub mod confine;
pub mod contain;
pub mod env;
pub mod errors;
pub mod floor;
pub mod forksafe;
pub mod keeper;
pub mod kill;
pub mod landlock;
mod lifecycle;
pub mod notifier;
pub mod pipes;
pub mod process;
pub mod scrub;
pub mod seccomp;
pub mod spawn;
pub mod spawn_queue;
pub mod spawner;
pub mod spill;
pub mod supervisor;
mod sys;
pub mod utf8;
pub mod verdict;

#[cfg(feature = "python")]
mod bindings;
