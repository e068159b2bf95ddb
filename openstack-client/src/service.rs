//! OpenStack service types, their catalog aliases, and endpoint interfaces.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceType {
    Identity,
    BlockStorage,
    Compute,
    SharedFileSystem,
    KeyManager,
}

impl ServiceType {
    pub const ALL: [ServiceType; 5] = [
        ServiceType::Identity,
        ServiceType::BlockStorage,
        ServiceType::Compute,
        ServiceType::SharedFileSystem,
        ServiceType::KeyManager,
    ];

    /// Official service type.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceType::Identity => "identity",
            ServiceType::BlockStorage => "block-storage",
            ServiceType::Compute => "compute",
            ServiceType::SharedFileSystem => "shared-file-system",
            ServiceType::KeyManager => "key-manager",
        }
    }

    /// Catalog types that name this service, most preferred first. Real
    /// clouds still register Cinder as `volumev3` and Manila as `sharev2`.
    pub fn catalog_aliases(self) -> &'static [&'static str] {
        match self {
            ServiceType::Identity => &["identity"],
            ServiceType::BlockStorage => &["block-storage", "volumev3", "volume", "block-store"],
            ServiceType::Compute => &["compute"],
            ServiceType::SharedFileSystem => &["shared-file-system", "sharev2", "share"],
            ServiceType::KeyManager => &["key-manager"],
        }
    }
}

impl fmt::Display for ServiceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ServiceType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.replace('_', "-").to_ascii_lowercase();
        ServiceType::ALL
            .into_iter()
            .find(|t| t.catalog_aliases().contains(&norm.as_str()))
            .ok_or_else(|| format!("unknown service type {s:?}"))
    }
}

/// Which catalog endpoint of a service to use (`os-endpoint-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Interface {
    #[default]
    Public,
    Internal,
    Admin,
}

impl Interface {
    pub fn as_str(self) -> &'static str {
        match self {
            Interface::Public => "public",
            Interface::Internal => "internal",
            Interface::Admin => "admin",
        }
    }
}

impl FromStr for Interface {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().trim_end_matches("url") {
            "public" => Ok(Interface::Public),
            "internal" => Ok(Interface::Internal),
            "admin" => Ok(Interface::Admin),
            _ => Err(format!("{s:?} is not one of public, internal, admin")),
        }
    }
}

impl fmt::Display for Interface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_parse() {
        assert_eq!(
            "volumev3".parse::<ServiceType>(),
            Ok(ServiceType::BlockStorage)
        );
        assert_eq!(
            "sharev2".parse::<ServiceType>(),
            Ok(ServiceType::SharedFileSystem)
        );
        assert_eq!(
            "key_manager".parse::<ServiceType>(),
            Ok(ServiceType::KeyManager)
        );
        assert!("image".parse::<ServiceType>().is_err());
        assert_eq!("internalURL".parse::<Interface>(), Ok(Interface::Internal));
    }
}
