"""Writes data/diabetes.parquet, the table this example trains on: scikit-learn's bundled
diabetes data (442 patients, offline), unscaled, with the disease progression one year after
the baseline as the `progression` column. Run it again to regenerate the file:

    python examples/regression/make_data.py
"""

from __future__ import annotations

from pathlib import Path


def main() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import load_diabetes

    frame = load_diabetes(as_frame=True, scaled=False).frame
    frame = frame.rename(columns={"target": "progression"}).astype("float64")
    out = Path(__file__).resolve().parent / "data" / "diabetes.parquet"
    out.parent.mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), out)
    print(f"wrote {out} ({len(frame)} rows, columns {list(frame.columns)})")


if __name__ == "__main__":
    main()
