"""trainstack's training job: PySpark data stage + multi-worker TensorFlow in a barrier stage."""

__version__ = "0.1.0"
