"""video-denoising: unrolled transformers (UT, DUST) trained with and without layer-wise descent constraints.

Do the constraints make them better video denoisers than ERM at test noise above the training level? The
five-file layout of :mod:`descentlab.experiments`, with ``legacy`` (the cells of runs made before the cell
store).
"""
