//! The share protocol one instance of the driver serves: what the
//! options select, and what parameters, access rules and mounts depend on.

/// The share protocol one instance of the driver serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ShareProtocol {
    #[value(name = "NFS", alias = "nfs")]
    Nfs,
    #[value(name = "CEPHFS", alias = "cephfs")]
    Cephfs,
}

impl ShareProtocol {
    /// Manila's name for it (`share_proto`).
    pub fn as_manila(self) -> &'static str {
        match self {
            ShareProtocol::Nfs => "NFS",
            ShareProtocol::Cephfs => "CEPHFS",
        }
    }

    /// The access rule type the protocol's clients are granted by.
    pub fn access_type(self) -> &'static str {
        match self {
            ShareProtocol::Nfs => "ip",
            ShareProtocol::Cephfs => "cephx",
        }
    }
}

impl std::fmt::Display for ShareProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_manila())
    }
}
