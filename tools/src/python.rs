//! The Python a comparison runs against: `python3`, or the interpreter named
//! by WORKBOOK_PYTHON.

use std::process::Command;

/// The interpreter, when it can import every one of `modules` (`"torch"`,
/// `"torch, transformers"`); otherwise why not, in words that say what to do.
pub fn python_that_imports(modules: &str) -> Result<String, String> {
    let python = std::env::var("WORKBOOK_PYTHON").unwrap_or_else(|_| "python3".into());
    let imports =
        Command::new(&python).args(["-c", &format!("import {modules}")]).output().is_ok_and(|o| o.status.success());
    match imports {
        true => Ok(python),
        false => Err(format!(
            "`{python}` cannot import {modules}: install them (pip install {}) or set WORKBOOK_PYTHON to an \
             interpreter that can",
            modules.replace(',', "")
        )),
    }
}
