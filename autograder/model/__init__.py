"""The model: what a kernel costs the memory system and the matrix units, predicted from
its trace in Triton's interpreter. It is the feedback a learner gets without a GPU, and
it is always labelled a prediction.

* ``trace.py`` records every access and ``tl.dot`` of the kernels a block of code
  launches (``trace_data.py``: what a trace holds); ``footprint.py`` reduces an access to the
  sectors it touches;
* ``traffic.py``: sector efficiency, DRAM traffic through an L2 of the card's size,
  out-of-bounds accesses and races, and the prediction for a card;
* ``time_model.py``: how long a traced launch would take on that card;
* ``matrix_units.py``: whether each ``tl.dot`` would feed the tensor cores and its tile
  fit an SM;
* ``autotune.py``: ``@triton.autotune`` on a CPU, ranking configurations by prediction;
* ``plot.py``: the roofline and the access patterns as pictures (plotly, a lab extra);
* ``alpha_beta.py``: lab 08's α–β fit of a ring all-reduce's timings, the held-out sizes
  against it, and the bus-bandwidth chart (its width the book's, from ``course.record``).

It imports the device layer (the card's datasheet and ceilings) and nothing above it;
the evidence a check gathers, beside it, is none of its business.
"""
