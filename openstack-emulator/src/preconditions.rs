//! What a test needs of the machine it runs on. A test whose precondition
//! is missing must never pass by returning early: it fails, unless whoever
//! runs it opted out by name, and then it says that it skipped.

/// Set to `skip` to let the tests that need root return early, each
/// saying so, in an unprivileged run.
pub const WITHOUT_ROOT: &str = "TESTS_WITHOUT_ROOT";

/// Whether a test that needs root (`why`: for what) may go on. Without
/// root it panics, unless [`WITHOUT_ROOT`] is `skip`: then it prints
/// that the test skipped and returns false.
pub fn root(why: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let opted_out = std::env::var(WITHOUT_ROOT).is_ok_and(|v| v == "skip");
    assert!(
        opted_out,
        "needs root ({why}); run as root, or set {WITHOUT_ROOT}=skip to skip the tests that need it"
    );
    eprintln!("skipped: needs root ({why}); {WITHOUT_ROOT}=skip");
    false
}
