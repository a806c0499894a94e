//! Writes the JSON Schema of every message to `docs/schema/`, from the types of
//! `tangram-shared`. Run after changing a wire type:
//! `cargo run -p tangram-shared --example gen-schema`; `tests/schema.rs` fails until the
//! committed files match.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/schema");
    std::fs::create_dir_all(&dir)?;
    let files = tangram_shared::schema::all();
    // Files of messages that no longer exist would otherwise linger.
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with(".json") && !files.iter().any(|f| f.name == name) {
            std::fs::remove_file(&path)?;
        }
    }
    for f in &files {
        std::fs::write(dir.join(f.name), f.contents())?;
        println!("wrote docs/schema/{}", f.name);
    }
    Ok(())
}
