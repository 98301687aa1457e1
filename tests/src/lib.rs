//! Cross-crate integration suites (no library code).
//!
//! - `tests/sandbox.rs`: every sandbox limit of a plugin instance fires with an error
//!   naming the plugin, the operator, the subtask and the limit, and the host survives:
//!   a healthy job run right after each fault, in the same process, commits exactly the
//!   right output, and the failed job leaves no committed output.
//! - `tests/loading.rs`: components of the wrong world, core modules and garbage files
//!   are refused at load and planning time with messages naming the fault; compiled
//!   components are cached on disk.
