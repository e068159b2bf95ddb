//! Command lines written for upstream's images. Upstream's images have no
//! entrypoint, so its charts and manifests name the program as the first
//! argument (`args: [/bin/cinder-csi-plugin, -v=2, --endpoint=…]`); ours
//! have one. Such a command line runs ours unchanged once that first
//! argument is dropped.

use std::ffi::{OsStr, OsString};
use std::path::Path;

/// The arguments without a first one (after the program's own `argv[0]`)
/// naming `program` by its file name, wherever it lives
/// (`/bin/manila-csi-plugin`, `manila-csi-plugin`). Any other first
/// argument stays, for the parser to refuse when it is stray.
pub fn without_program_path(
    args: impl IntoIterator<Item = OsString>,
    program: &str,
) -> Vec<OsString> {
    let mut args: Vec<_> = args.into_iter().collect();
    let names_program = args.get(1).is_some_and(|a| {
        !a.to_string_lossy().starts_with('-')
            && Path::new(a).file_name() == Some(OsStr::new(program))
    });
    if names_program {
        args.remove(1);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_first_argument_naming_the_program_is_dropped_and_nothing_else() {
        let p = "manila-csi-plugin";
        let dropped = without_program_path(
            os(&[
                "/usr/local/bin/manila-csi-plugin",
                "/bin/manila-csi-plugin",
                "-v=2",
            ]),
            p,
        );
        assert_eq!(dropped, os(&["/usr/local/bin/manila-csi-plugin", "-v=2"]));
        let bare = without_program_path(os(&["x", "manila-csi-plugin", "--help"]), p);
        assert_eq!(bare, os(&["x", "--help"]));
        // another program's name, a later position, a flag: all kept
        for kept in [
            os(&["x", "/bin/cinder-csi-plugin", "-v=2"]),
            os(&["x", "-v=2", "/bin/manila-csi-plugin"]),
            os(&["x", "--endpoint=/bin/manila-csi-plugin"]),
            os(&["x"]),
        ] {
            assert_eq!(without_program_path(kept.clone(), p), kept);
        }
        // only once: a second one is stray
        let twice = without_program_path(
            os(&["x", "/bin/manila-csi-plugin", "/bin/manila-csi-plugin"]),
            p,
        );
        assert_eq!(twice, os(&["x", "/bin/manila-csi-plugin"]));
    }
}
