//! Generates the CSI and KMS v2 gRPC code with protox (no system protoc) and
//! replaces prost's derived `Debug` on every message that carries a secret
//! with one that prints `<redacted>` for those fields.

use std::fmt::Write as _;
use std::path::PathBuf;

use prost_reflect::{MessageDescriptor, Value};

/// Fields that must never reach a log although the upstream proto has no
/// option marking them: KMS data-key seeds and their wrapped form, and CSI
/// mount flags (the spec says they may carry credentials).
const EXTRA_SECRET_FIELDS: &[(&str, &str)] = &[
    ("v2.EncryptRequest", "plaintext"),
    ("v2.EncryptResponse", "ciphertext"),
    ("v2.DecryptRequest", "ciphertext"),
    ("v2.DecryptResponse", "plaintext"),
    ("csi.v1.VolumeCapability.MountVolume", "mount_flags"),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["csi/v1/csi.proto", "kms/v2/api.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let mut compiler = protox::Compiler::new(["."])?;
    compiler.include_imports(true);
    compiler.open_files(files)?;
    let pool = compiler.descriptor_pool();

    let secret_ext = pool
        .get_extension_by_name("csi.v1.csi_secret")
        .ok_or("csi.proto lacks the csi_secret extension")?;

    // message full name -> secret field names
    let mut redacted: Vec<(MessageDescriptor, Vec<String>)> = Vec::new();
    for msg in pool.all_messages() {
        let mut secret_fields = Vec::new();
        for field in msg.fields() {
            let opts = field.options();
            let marked = opts.has_extension(&secret_ext)
                && matches!(opts.get_extension(&secret_ext).as_ref(), Value::Bool(true));
            let listed = EXTRA_SECRET_FIELDS
                .iter()
                .any(|(m, f)| *m == msg.full_name() && *f == field.name());
            if marked || listed {
                secret_fields.push(field.name().to_string());
            }
        }
        if !secret_fields.is_empty() {
            redacted.push((msg, secret_fields));
        }
    }
    for (m, f) in EXTRA_SECRET_FIELDS {
        if !redacted
            .iter()
            .any(|(msg, fields)| msg.full_name() == *m && fields.iter().any(|x| x == f))
        {
            return Err(format!("listed secret field {m}.{f} does not exist").into());
        }
    }

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut per_package: std::collections::BTreeMap<String, String> = Default::default();
    for (msg, fields) in &redacted {
        let code = per_package
            .entry(msg.package_name().to_string())
            .or_default();
        write_redacted_debug(code, msg, fields)?;
    }
    for pkg in ["csi.v1", "v2"] {
        let code = per_package.remove(pkg).unwrap_or_default();
        std::fs::write(out_dir.join(format!("{pkg}.redacted_debug.rs")), code)?;
    }

    // every gRPC method path the protos define: the plugins' metrics label
    // a call by it, and anything else as "unknown"
    let mut methods = String::from("pub const GRPC_METHODS: &[&str] = &[\n");
    for service in pool.services() {
        for method in service.methods() {
            writeln!(
                methods,
                "    \"/{}/{}\",",
                service.full_name(),
                method.name()
            )?;
        }
    }
    methods.push_str("];\n");
    std::fs::write(out_dir.join("grpc_methods.rs"), methods)?;

    let skip: Vec<String> = redacted
        .iter()
        .map(|(m, _)| format!(".{}", m.full_name()))
        .collect();
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .skip_debug(skip)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}

fn write_redacted_debug(
    out: &mut String,
    msg: &MessageDescriptor,
    secret_fields: &[String],
) -> Result<(), std::fmt::Error> {
    // Rust path of the message relative to its package module: nested
    // messages live in a module named after their parent in snake case.
    let relative = msg
        .full_name()
        .strip_prefix(msg.package_name())
        .unwrap_or(msg.full_name())
        .trim_start_matches('.');
    let mut parts: Vec<&str> = relative.split('.').collect();
    let name = parts.pop().unwrap_or(relative);
    let mut path = String::new();
    for p in parts {
        write!(path, "{}::", snake_case(p))?;
    }
    writeln!(out, "impl ::core::fmt::Debug for {path}{name} {{")?;
    writeln!(
        out,
        "    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {{"
    )?;
    writeln!(out, "        let mut s = f.debug_struct({name:?});")?;
    let mut seen_oneofs = Vec::new();
    for field in msg.fields() {
        let (label, ident) = match field.containing_oneof() {
            Some(o) if !field.field_descriptor_proto().proto3_optional() => {
                if seen_oneofs.contains(&o.name().to_string()) {
                    continue;
                }
                seen_oneofs.push(o.name().to_string());
                (o.name().to_string(), rust_ident(o.name()))
            }
            _ => (field.name().to_string(), rust_ident(field.name())),
        };
        if secret_fields.iter().any(|s| *s == field.name()) {
            writeln!(out, "        s.field({label:?}, &crate::Redacted);")?;
        } else {
            writeln!(out, "        s.field({label:?}, &self.{ident});")?;
        }
    }
    writeln!(out, "        s.finish()")?;
    writeln!(out, "    }}")?;
    writeln!(out, "}}")?;
    Ok(())
}

fn snake_case(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn rust_ident(name: &str) -> String {
    match name {
        "type" | "match" | "ref" | "mod" | "fn" | "struct" | "enum" | "use" | "impl" | "self"
        | "loop" => {
            format!("r#{name}")
        }
        _ => name.to_string(),
    }
}
