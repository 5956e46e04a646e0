# The MLX extension redrafter_ext/mlx/_ext: MLX primitives (csrc/mlx) over the torch-free CPU
# kernels (csrc/cpu, compiled again here without c10) and, on macOS with a Metal MLX, the Metal
# dispatch (csrc/metal/dispatch.cpp) plus redrafter_ext_mlx.metallib installed next to the module.
# MLX and nanobind are located through the Python that runs the build (mlx and nanobind wheels).
# Included from CMakeLists.txt (its scope); return() ends this file only.
function(_redrafter_mlx_missing why)
  if(REDRAFTER_MLX STREQUAL "ON")
    message(FATAL_ERROR "REDRAFTER_MLX=ON but ${why}")
  endif()
  message(STATUS "redrafter_ext: ${why}; skipping the MLX extension")
endfunction()

set(REDRAFTER_HAVE_MLX OFF)
execute_process(
  COMMAND "${Python_EXECUTABLE}" -m mlx --cmake-dir
  OUTPUT_VARIABLE _mlx_dir RESULT_VARIABLE _mlx_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _mlx_rc EQUAL 0)
  _redrafter_mlx_missing("`python -m mlx --cmake-dir` failed (pip install 'mlx[cpu]' on Linux, mlx on macOS)")
  return()
endif()
execute_process(
  COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
  OUTPUT_VARIABLE _nb_dir RESULT_VARIABLE _nb_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _nb_rc EQUAL 0)
  _redrafter_mlx_missing("`python -m nanobind --cmake_dir` failed (pip install 'nanobind>=2.0', matching mlx's)")
  return()
endif()
find_package(MLX CONFIG QUIET PATHS "${_mlx_dir}" NO_DEFAULT_PATH)
if(NOT MLX_FOUND)
  _redrafter_mlx_missing("no MLXConfig.cmake under ${_mlx_dir}")
  return()
endif()
find_package(nanobind CONFIG QUIET PATHS "${_nb_dir}" NO_DEFAULT_PATH)
if(NOT nanobind_FOUND)
  _redrafter_mlx_missing("no nanobind-config.cmake under ${_nb_dir}")
  return()
endif()
set(REDRAFTER_HAVE_MLX ON)

set(REDRAFTER_MLX_SOURCES
  csrc/mlx/module.cpp
  csrc/mlx/primitives.cpp
  ${REDRAFTER_CPU_KERNELS}
)

# Metal: only where MLX itself runs on Metal (macOS). Untested in this project's CI (Linux).
set(REDRAFTER_MLX_METAL OFF)
if(APPLE AND MLX_BUILD_METAL)
  file(GLOB _metal_sources CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/csrc/metal/*.metal")
  if(EXISTS "${CMAKE_CURRENT_SOURCE_DIR}/csrc/metal/dispatch.cpp" AND _metal_sources)
    set(REDRAFTER_MLX_METAL ON)
    list(APPEND REDRAFTER_MLX_SOURCES csrc/metal/dispatch.cpp)
  else()
    message(WARNING "redrafter_ext: MLX has Metal but csrc/metal/dispatch.cpp or csrc/metal/*.metal is "
                    "missing: building the MLX extension without GPU kernels (eval on the GPU will raise)")
  endif()
endif()

# nanobind shares types (mlx.core.array, Stream) only between modules of one ABI: a stable-ABI
# (abi3) build and a version-specific one keep separate type registries. So follow mlx.core: abi3
# when its module is (nanobind's STABLE_ABI needs Python >= 3.12), version-specific otherwise.
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c "import mlx.core; print(mlx.core.__file__)"
  OUTPUT_VARIABLE _mlx_core RESULT_VARIABLE _mlx_core_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
if(_mlx_core MATCHES "\\.abi3\\.")
  set(_mlx_abi STABLE_ABI)
else()
  set(_mlx_abi "")
  if(NOT "${SKBUILD_SABI_VERSION}" STREQUAL "")
    message(WARNING "redrafter_ext: mlx.core (${_mlx_core}) is not an abi3 module, so _ext is built for "
                    "Python ${Python_VERSION} only, inside a wheel tagged abi3 for the torch module "
                    "(wheel.py-api): on another Python `redrafter_ext.mlx` will not import")
  endif()
endif()
# nanobind refuses any linked-mode build while scikit-build-core asks for an abi3 wheel below
# cp312 (the torch module's tag); the MLX module's ABI is decided above, so hide the request here.
set(_sabi_saved "${SKBUILD_SABI_VERSION}")
set(SKBUILD_SABI_VERSION "")
nanobind_add_module(_ext NB_DOMAIN mlx ${_mlx_abi} NB_STATIC NOMINSIZE ${REDRAFTER_MLX_SOURCES})
set(SKBUILD_SABI_VERSION "${_sabi_saved}")
# csrc for "cpu/..." and "metal/..."; no csrc/mlx header is named like an MLX "mlx/*.h" header
target_include_directories(_ext PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/csrc)
target_link_libraries(_ext PRIVATE mlx)
# the CPU kernels without torch: project-owned 16-bit types instead of c10's (csrc/cpu/types.h)
target_compile_definitions(_ext PRIVATE REDRAFTER_CPU_NO_C10=1)
target_compile_options(_ext PRIVATE -O3 -Wall -Wno-unused-parameter)
# libmlx lives in the mlx wheel: site-packages/mlx/lib, two levels above redrafter_ext/mlx/_ext*.so
if(APPLE)
  set(_rpath "@loader_path/../../mlx/lib")
else()
  set(_rpath "$ORIGIN/../../mlx/lib")
endif()
set_target_properties(_ext PROPERTIES INSTALL_RPATH "${_rpath}" BUILD_RPATH "${MLX_LIBRARY_DIRS}")
install(TARGETS _ext LIBRARY DESTINATION redrafter_ext/mlx)

if(REDRAFTER_MLX_METAL)
  target_compile_definitions(_ext PRIVATE REDRAFTER_MLX_METAL=1)
  # MLX_INCLUDE_DIRS adds metal-cpp and MLX's Metal kernel headers for dispatch.cpp
  target_include_directories(_ext PRIVATE ${MLX_INCLUDE_DIRS})
  # mlx_build_metallib (MLX's extension.cmake): xcrun metal per source, then link the .metallib
  mlx_build_metallib(
    TARGET redrafter_ext_mlx_metallib
    TITLE redrafter_ext_mlx
    SOURCES ${_metal_sources}
    INCLUDE_DIRS ${CMAKE_CURRENT_SOURCE_DIR}/csrc ${MLX_INCLUDE_DIRS}
    OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  add_dependencies(_ext redrafter_ext_mlx_metallib)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/redrafter_ext_mlx.metallib DESTINATION redrafter_ext/mlx)
endif()

list(APPEND REDRAFTER_BUILT "mlx(metal=${REDRAFTER_MLX_METAL})")
