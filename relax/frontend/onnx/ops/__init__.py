"""The converters, one module per operator family; importing this package registers them."""
from . import (elementwise, tensor, nn, reduce, index, image, control, rnn, quant,  # noqa: F401
               sequence, detection)
