# Installs libgradstream.so, the public header, CMake package files (find_package(gradstream))
# and a pkg-config file.
install(TARGETS gradstream EXPORT gradstreamTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/gradstream/gradstream.h
              ${GS_GENERATED_DIR}/gradstream/export.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/gradstream)
install(TARGETS gradstream-perf RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT gradstreamTargets NAMESPACE gradstream::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gradstream)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/gradstreamConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/gradstreamConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gradstream)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/gradstreamConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/gradstreamConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/gradstreamConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gradstream)
configure_file(${PROJECT_SOURCE_DIR}/cmake/gradstream.pc.in
               ${CMAKE_CURRENT_BINARY_DIR}/gradstream.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/gradstream.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
