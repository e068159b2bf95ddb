//! Contract tests: the same client calls against the emulator (default)
//! or the real test cloud (`OPENSTACK_TEST_BACKEND=real`, state directory
//! from `OPENSTACK_TEST_CLOUD_DIR`, default `.openstack-cloud` in the
//! repository; start it with `tests/openstack/cloud.py up`). A service the
//! real cloud's profile lacks is reported as skipped.

//!
//! One program, a module per service; [`backend`] chooses where they run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

#[path = "../common/mod.rs"]
mod common;

mod backend;
mod barbican;
mod cinder;
mod keystone;
mod manila;
mod nova;
