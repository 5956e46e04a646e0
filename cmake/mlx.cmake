# The MLX extension (issue: MLX backend). Detected here so AUTO/ON behave as documented.
execute_process(
  COMMAND "${Python_EXECUTABLE}" -m mlx --cmake-dir
  OUTPUT_VARIABLE _mlx_dir RESULT_VARIABLE _mlx_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _mlx_rc EQUAL 0)
  set(REDRAFTER_HAVE_MLX OFF)
  if(REDRAFTER_MLX STREQUAL "ON")
    message(FATAL_ERROR "REDRAFTER_MLX=ON but `python -m mlx --cmake-dir` failed; pip install 'mlx[cpu]' (Linux) or mlx (macOS)")
  endif()
  message(STATUS "redrafter_ext: mlx not found, skipping the MLX extension")
  return()
endif()
set(REDRAFTER_HAVE_MLX ON)
if(REDRAFTER_MLX STREQUAL "ON")
  message(FATAL_ERROR "REDRAFTER_MLX=ON: the MLX extension is not implemented yet")
endif()
message(STATUS "redrafter_ext: mlx found at ${_mlx_dir}; the MLX extension is not implemented yet, skipping")
