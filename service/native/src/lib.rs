//! Confluent-framed Avro records (magic byte 0, a 4-byte schema id, the Avro binary body) of one writer
//! schema decoded together into one Arrow struct array, with arrow-avro's streaming `Decoder`.
//!
//! The decoder reads whatever bytes it is given as a stream of records; it does not know where one
//! Kafka record ends. So each record is fed on its own and must be read as exactly one row using
//! exactly its bytes: a record with bytes left over, a truncated one or two in one value are bad
//! records, reported with their index and the reason, and the others still decode together. All the
//! records of a call carry the same schema id, so the decoder's remaining capacity counts the rows.
//!
//! Python sees `schema_ids(values)` and `decode(schema_id, schema, values)` (given only values that
//! `schema_ids` found to carry `schema_id`); the batch is handed to
//! pyarrow through the Arrow PyCapsule protocol (`pyarrow.array(batch)`), without a copy.

use std::ffi::CString;

use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::{Array, StructArray};
use arrow_avro::reader::{Decoder, ReaderBuilder};
use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyTuple};

/// A decoded batch, exported once through `__arrow_c_array__`.
#[pyclass]
struct Batch {
    array: Option<StructArray>,
}

#[pymethods]
impl Batch {
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(
        &mut self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let _ = requested_schema; // the batch is exported in its own types
        let array = self.array.take().ok_or_else(|| PyValueError::new_err("the batch was exported already"))?;
        let data = array.into_data();
        let schema =
            FFI_ArrowSchema::try_from(data.data_type()).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let ffi_array = FFI_ArrowArray::new(&data);
        let schema = PyCapsule::new(py, schema, Some(CString::new("arrow_schema").unwrap()))?;
        let array = PyCapsule::new(py, ffi_array, Some(CString::new("arrow_array").unwrap()))?;
        PyTuple::new(py, [schema.into_any(), array.into_any()])
    }

    fn __len__(&self) -> usize {
        self.array.as_ref().map_or(0, |a| a.len())
    }
}

fn decoder(schema_id: u32, schema: &str, rows: usize) -> Result<Decoder, String> {
    let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
    store
        .set(Fingerprint::Id(schema_id), AvroSchema::new(schema.to_string()))
        .map_err(|e| e.to_string())?;
    ReaderBuilder::new()
        .with_batch_size(rows.max(1))
        .with_writer_schema_store(store)
        .build_decoder()
        .map_err(|e| e.to_string())
}

/// One framed record through `decoder`: exactly its bytes as exactly one row.
fn feed(decoder: &mut Decoder, schema_id: u32, value: &[u8]) -> Result<(), String> {
    let before = decoder.capacity();
    let consumed = decoder
        .decode(value)
        .map_err(|e| format!("the payload does not match schema id {schema_id}: {e}"))?;
    let rows = before - decoder.capacity();
    let body = value.len().saturating_sub(5);
    if rows == 1 && consumed < value.len() {
        return Err(format!(
            "the payload does not match schema id {schema_id}: {} bytes left after the record",
            value.len() - consumed
        ));
    }
    if rows == 0 && consumed == value.len() {
        return Err(format!(
            "the payload does not match schema id {schema_id}: its {body} bytes end before the record does"
        ));
    }
    if rows != 1 || consumed != value.len() {
        return Err(format!(
            "the payload does not match schema id {schema_id}: its {body} bytes read as {rows} record(s)"
        ));
    }
    Ok(())
}

type Decoded = (Option<StructArray>, Vec<usize>, Vec<(usize, String)>);

fn decode_all(schema_id: u32, schema: &str, values: &[&[u8]]) -> Result<Decoded, String> {
    let flush = |mut d: Decoder| d.flush().map(|b| b.map(StructArray::from)).map_err(|e| e.to_string());
    let mut all = decoder(schema_id, schema, values.len())?;
    if values.iter().all(|v| feed(&mut all, schema_id, v).is_ok()) {
        return Ok((flush(all)?, (0..values.len()).collect(), Vec::new()));
    }
    // Some record is bad: find each by feeding the records to a probe with room for all of them
    // (never flushed; made again only after a bad record, whose state it can't be trusted with), then
    // decode the others together.
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    let mut probe = decoder(schema_id, schema, values.len())?;
    for (i, v) in values.iter().enumerate() {
        match feed(&mut probe, schema_id, v) {
            Ok(()) => good.push(i),
            Err(reason) => {
                bad.push((i, reason));
                probe = decoder(schema_id, schema, values.len())?;
            }
        }
    }
    let mut rest = decoder(schema_id, schema, good.len())?;
    for &i in &good {
        feed(&mut rest, schema_id, values[i])?;
    }
    Ok((flush(rest)?, good, bad))
}

/// Each value's schema id; -1 for a value that is None or has no Confluent wire-format header; -2 for
/// one that ends with its own header. The decoder would take such a tail as the start of the next
/// record and wait for its body, so that value could pass as one good record: it is left to the
/// record-at-a-time reader, which tells a body that merely ends in those bytes from bytes left over.
#[pyfunction]
fn schema_ids(values: Vec<Option<Bound<'_, PyBytes>>>) -> Vec<i64> {
    values
        .iter()
        .map(|v| match v.as_ref().map(|b| b.as_bytes()) {
            Some(v @ [0, _, _, _, _, _, ..]) if v.len() >= 10 && v[v.len() - 5..] == v[..5] => -2,
            Some([0, a, b, c, d, _, ..]) | Some([0, a, b, c, d]) => u32::from_be_bytes([*a, *b, *c, *d]) as i64,
            _ => -1,
        })
        .collect()
}

/// Framed records that all carry `schema_id` (whose writer schema is `schema`, Avro JSON) →
/// (the good ones as one struct array, or None when there are none; their indices; the bad ones'
/// (index, reason)). ValueError when the decoder can't take the schema.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn decode(
    py: Python<'_>,
    schema_id: u32,
    schema: &str,
    values: Vec<Bound<'_, PyBytes>>,
) -> PyResult<(Option<Batch>, Vec<usize>, Vec<(usize, String)>)> {
    let slices: Vec<&[u8]> = values.iter().map(|v| v.as_bytes()).collect();
    let (array, good, bad) =
        py.detach(|| decode_all(schema_id, schema, &slices)).map_err(PyValueError::new_err)?;
    Ok((array.map(|a| Batch { array: Some(a) }), good, bad))
}

#[pymodule]
fn icesink_avrodec(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Batch>()?;
    m.add_function(wrap_pyfunction!(schema_ids, m)?)?;
    m.add_function(wrap_pyfunction!(decode, m)?)?;
    Ok(())
}
