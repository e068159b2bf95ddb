//! The walk on the embedded OpenStack emulator: one emulator (with its
//! realistic delays, playing the hypervisor with loop devices as root),
//! the three plugin binaries started against it, each part walked in turn.

use std::path::PathBuf;
use std::sync::Arc;

use csi_sanity::harness::{CinderOnEmulator, HarnessOptions, ManilaOnEmulator, ManilaOptions};
use openstack_emulator::{Emulator, EmulatorConfig};

use crate::report::say;
use crate::{Logs, Options, Report, WalkError};

/// The three plugin binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub cinder: PathBuf,
    pub manila: PathBuf,
    pub kms: PathBuf,
}

impl Binaries {
    fn find(options: &Options) -> Result<Self, WalkError> {
        let dir = match &options.bin_dir {
            Some(d) => d.clone(),
            None => std::env::current_exe()?
                .parent()
                .map(PathBuf::from)
                .ok_or_else(|| WalkError::Config("this program has no directory".into()))?,
        };
        let b = Self {
            cinder: dir.join("cinder-csi-plugin"),
            manila: dir.join("manila-csi-plugin"),
            kms: dir.join("barbican-kms-plugin"),
        };
        for (part, p) in [
            ("volume", &b.cinder),
            ("share", &b.manila),
            ("secrets", &b.kms),
        ] {
            if options.wants(part) && !p.is_file() {
                return Err(WalkError::Config(format!(
                    "{} is missing: build it first (`cargo build -p csi-cinder -p csi-manila -p kms-barbican -p suite-walk`) or name its directory with --bin-dir",
                    p.display()
                )));
            }
        }
        Ok(b)
    }
}

pub async fn run(options: &Options, report: &mut Report, logs: &Logs) -> Result<(), WalkError> {
    let bins = Binaries::find(options)?;
    let root = nix::unistd::Uid::effective().is_root();
    say("suite-walk: the suite's three plugins on the embedded OpenStack emulator");
    if !root {
        say(
            "(not root: the node steps that need loop devices and mounts are skipped; run as root to see them)",
        );
    }

    // the volume part's harness brings the emulator, playing the
    // hypervisor as root; the other parts share it
    let cinder = if options.wants("volume") {
        let mut o = HarnessOptions::new(&bins.cinder);
        o.hypervisor = root;
        o.log_file = Some(logs.file("cinder-csi-plugin.log"));
        Some(CinderOnEmulator::start(o).await?)
    } else {
        None
    };
    let emulator = match &cinder {
        Some(c) => c.emulator.clone(),
        None => Arc::new(
            Emulator::start(EmulatorConfig {
                availability_zones: vec!["nova".into(), "zone-b".into()],
                ..Default::default()
            })
            .await
            .map_err(|e| WalkError::Emulator(e.to_string()))?,
        ),
    };
    say(&format!(
        "OpenStack emulator at {} (Keystone, Cinder, Nova, Manila, Barbican; real status transitions and delays)",
        emulator.url()
    ));

    if let Some(h) = &cinder {
        crate::volume::walk(report, h, root).await;
    }
    if options.wants("share") {
        let mut o = ManilaOptions::new(&bins.manila, "NFS");
        o.stand_ins = root;
        o.emulator = Some(emulator.clone());
        o.log_file = Some(logs.file("manila-csi-plugin.log"));
        let h = ManilaOnEmulator::start(o).await?;
        crate::share::walk(report, &h, root).await;
    }
    if options.wants("secrets") {
        crate::secrets::walk(report, &emulator, &bins.kms, logs).await;
    }
    drop(cinder);
    Ok(())
}
